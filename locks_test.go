package kdshost_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every lock in host/, guard/ and the library (engine/, policy/, internal/) says what it guards, and the lock table of docs/architecture.md
// (its "Locks" section) lists every one of them, and nothing else: a struct's field as
// `package.Type.field`, a function's own as `package.function.name`.
func TestTheLockTableListsEveryLock(t *testing.T) {
	code := map[string]string{} // lock -> where
	var uncommented []string
	for _, root := range []string{"host", "guard", "engine", "policy", "internal"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || path == "internal/xdstest") { // xdstest: the test harness
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			for name, commented := range locksOf(f) {
				code[name] = fset.File(f.Pos()).Name()
				if !commented {
					uncommented = append(uncommented, name+" ("+path+")")
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(uncommented) > 0 {
		slices.Sort(uncommented)
		t.Errorf("these locks do not say what they guard (a comment on the field or its line):\n%s", strings.Join(uncommented, "\n"))
	}

	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Locks")
	if !ok {
		t.Fatal(`docs/architecture.md has no "### Locks" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Za-z0-9_.]+)`").FindAllStringSubmatch(section, -1) {
		listed[m[1]] = true
	}
	var missing, stale []string
	for name, where := range code {
		if !listed[name] {
			missing = append(missing, name+" ("+where+")")
		}
	}
	for name := range listed {
		if _, ok := code[name]; !ok {
			stale = append(stale, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(stale)
	if len(missing) > 0 {
		t.Errorf("docs/architecture.md's lock table does not list:\n%s", strings.Join(missing, "\n"))
	}
	if len(stale) > 0 {
		t.Errorf("docs/architecture.md's lock table lists locks the code does not have:\n%s", strings.Join(stale, "\n"))
	}
}

// locksOf names the locks a file declares (sync.Mutex and sync.RWMutex fields of its struct types,
// and variables of its functions), each after its package, and reports whether each has a
// comment.
func locksOf(f *ast.File) map[string]bool {
	out := map[string]bool{}
	pkg := f.Name.Name + "."
	isLock := func(e ast.Expr) bool {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		pkg, ok := sel.X.(*ast.Ident)
		return ok && pkg.Name == "sync" && (sel.Sel.Name == "Mutex" || sel.Sel.Name == "RWMutex")
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.TypeSpec:
			st, ok := n.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, field := range st.Fields.List {
				if !isLock(field.Type) {
					continue
				}
				commented := field.Doc != nil || field.Comment != nil
				if len(field.Names) == 0 { // embedded
					out[pkg+n.Name.Name+"."+field.Type.(*ast.SelectorExpr).Sel.Name] = commented
				}
				for _, name := range field.Names {
					out[pkg+n.Name.Name+"."+name.Name] = commented
				}
			}
		case *ast.FuncDecl:
			if n.Body == nil {
				return false
			}
			ast.Inspect(n.Body, func(m ast.Node) bool {
				if vs, ok := m.(*ast.ValueSpec); ok && vs.Type != nil && isLock(vs.Type) {
					for _, name := range vs.Names {
						out[pkg+n.Name.Name+"."+name.Name] = true // a function's own: its use is in view
					}
				}
				return true
			})
			return false
		}
		return true
	})
	return out
}

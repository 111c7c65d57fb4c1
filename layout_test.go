// Package kdshost_test checks the repository's layout rules (docs/architecture.md, Packages):
// which folder may import which.
package kdshost_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/kds-host/kds-host/"

// allowed says, for the packages a pattern matches, which packages of the module they may depend
// on. A pattern is a folder of the module: "shared" is that package alone, "shared/..." the package
// and every one below it. Every rule whose pattern matches a package applies to it.
var allowed = []struct {
	under string
	may   []string
}{
	{"proto/...", []string{"proto/..."}},
	{"shared/...", []string{"shared/...", "proto/..."}},
	// The launcher is what the host and the conformance suite both run plugins with: it builds on
	// shared's handshake and plugin set, and on nothing that uses it.
	{"shared/launch/...", []string{"shared", "shared/launch/...", "proto/..."}},
	{"plugins/retry-forcer/...", []string{"plugins/retry-forcer/...", "shared/...", "proto/..."}},
	{"plugins/owner-check/...", []string{"plugins/owner-check/...", "shared/...", "proto/..."}},
	// The host's global serves its zones through the guard package, as an outside server would.
	{"host/...", []string{"host/...", "guard", "engine/...", "policy/...", "internal/serial", "internal/shrink", "internal/lograte", "internal/hclogslog", "internal/stack", "internal/within", "shared/...", "proto/...", "plugins/..."}},
	// The guard is what any go-control-plane server adopts, kds-host's global included: kds-host's
	// retry (the Machine, its scheduler, the session work queue and the events they hear), its NACK
	// reading, its cache and owner holds, the plugin runtime (Options.Plugins) and the built-in
	// policies; nothing of kds-host's application (host/...).
	{"guard/...", []string{"guard/...", "engine/...", "policy/...", "internal/...", "shared/...", "proto/...", "plugins/retry-forcer/...", "plugins/owner-check/..."}},
	// The library an xDS server adopts (the engine, its events, NACK reading, retry and owner
	// holds) imports nothing of kds-host's application.
	{"engine/...", []string{"engine/...", "internal/...", "shared/...", "proto/...", "plugins/retry-forcer/..."}},
	// The plugin runtime (go-plugin binaries, supervised) and the policy calls' deadline: a library
	// package, beside the engine, that builds on shared's protocol and the reference policies.
	{"policy/...", []string{"policy/...", "internal/...", "shared/...", "proto/...", "plugins/retry-forcer/...", "plugins/owner-check/..."}},
	{"internal/serial", nil},
	{"internal/shrink", nil},
	{"internal/lograte", nil},
	{"internal/hclogslog", nil},
	{"internal/within", nil},
	// The engine's parts assembled, for the guard's Cache and kds-host's global.
	{"internal/stack", []string{"engine/...", "internal/...", "shared/...", "proto/...", "plugins/retry-forcer/..."}},
	// The xDS test harness drives a real client against any server: it needs nothing of ours but
	// the helper that builds the client's binary.
	{"internal/xdstest/...", []string{"internal/xdstest/...", "internal/testbin"}},
}

// matches reports whether the module folder rel is matched by pattern (see allowed).
func matches(pattern, rel string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == tree || strings.HasPrefix(rel, tree+"/")
	}
	return rel == pattern
}

func TestLayout(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-f", `{{.ImportPath}} {{.Name}} {{join .Deps " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	names := map[string]string{} // package -> package name
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		names[f[0]] = f[1]
		deps[f[0]] = f[2:]
	}
	if len(names) < 5 {
		t.Fatalf("go list found only %d packages", len(names))
	}
	for pkg, ds := range deps {
		rel := strings.TrimPrefix(pkg, module)
		for _, rule := range allowed {
			if !matches(rule.under, rel) {
				continue
			}
			for _, d := range ds {
				if !strings.HasPrefix(d, module) {
					continue
				}
				drel := strings.TrimPrefix(d, module)
				ok := false
				for _, m := range rule.may {
					ok = ok || matches(m, drel)
				}
				if !ok {
					t.Errorf("%s depends on %s: %s may depend only on %v", rel, drel, rule.under, rule.may)
				}
				if names[d] == "main" {
					t.Errorf("%s depends on %s, a main package", rel, drel)
				}
			}
		}
	}
}

// docRef is a document of docs/ named in a source file.
var docRef = regexp.MustCompile(`\bdocs/[A-Za-z0-9_-]+\.md\b`)

// Defect 6 of issue 21: source comments pointed to a design document the repository does not
// have. The design is in docs/ (docs/architecture.md first); no .go file names the other one,
// and every document of docs/ a .go file names exists.
func TestNoSourceNamesAMissingDesignDocument(t *testing.T) {
	missing := "DESIGN" + ".md" // spelled in two, so that this file does not name it
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bench-results", "node_modules", ".data":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, missing) {
				t.Errorf("%s:%d names %s, which the repository does not have: point to docs/ instead", path, i+1, missing)
			}
			for _, doc := range docRef.FindAllString(line, -1) {
				if _, err := os.Stat(doc); err != nil {
					t.Errorf("%s:%d names %s, which the repository does not have", path, i+1, doc)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

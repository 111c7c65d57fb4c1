package kdshost_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// maxLines is the most lines a source file of host/, guard/ or the library may have.
const maxLines = 800

// sizeRoots are the folders held to maxLines: the host, the guard and the library. examples/
// is not one of them.
var sizeRoots = []string{"host", "guard", "engine", "policy", "internal"}

// Issue 48: no Go file of host/, guard/ or the library, other than tests and generated code, is
// over maxLines lines. A file allowed over it for a while is listed, with why, in shrinking; an
// entry whose file is no longer over (or no longer exists) fails too, so the list only shrinks.
func TestNoSourceFileIsOver800Lines(t *testing.T) {
	g := NewWithT(t)
	// shrinking: files over maxLines that work under way splits or deletes (path -> why).
	// Remove an entry once its file is gone or short enough.
	shrinking := map[string]string{}

	lines := map[string]int{} // source file -> its lines
	for _, root := range sizeRoots {
		if _, err := os.Stat(root); os.IsNotExist(err) {
			continue
		}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if generated(b) {
				return nil
			}
			lines[filepath.ToSlash(path)] = lineCount(b)
			return nil
		})
		g.Expect(err).NotTo(HaveOccurred(), "walk %s", root)
	}
	g.Expect(lines).NotTo(BeEmpty(), "no source file found: the test runs from the repository's root")

	var problems []string
	for _, path := range slices.Sorted(maps.Keys(lines)) {
		if n := lines[path]; n > maxLines {
			if _, allowed := shrinking[path]; !allowed {
				problems = append(problems, fmt.Sprintf("%s: %d lines, over %d: split it along its jobs", path, n, maxLines))
			}
		}
	}
	for _, path := range slices.Sorted(maps.Keys(shrinking)) {
		why := shrinking[path]
		n, exists := lines[path]
		switch {
		case !exists:
			problems = append(problems, fmt.Sprintf("%s (allowed over %d lines: %s) no longer exists: remove its entry from shrinking", path, maxLines, why))
		case n <= maxLines:
			problems = append(problems, fmt.Sprintf("%s (allowed over %d lines: %s) has %d lines now: remove its entry from shrinking", path, maxLines, why, n))
		}
	}
	g.Expect(strings.Join(problems, "\n")).To(BeEmpty())
}

// generated reports whether a Go file says it is generated: a line starting with "// Code
// generated" before its package clause.
func generated(src []byte) bool {
	for line := range bytes.Lines(src) {
		switch {
		case bytes.HasPrefix(line, []byte("// Code generated")):
			return true
		case bytes.HasPrefix(line, []byte("package ")):
			return false
		}
	}
	return false
}

// lineCount is how many lines src has, as wc -l counts them plus a last line without a newline.
func lineCount(src []byte) int {
	n := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

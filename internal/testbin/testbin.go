// Package testbin builds the repository's binaries for tests that run them as real processes.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	dir   string
	built = map[string]string{}
)

// Build compiles the main package at pkg (a path from the module root, e.g.
// "./plugins/retry-forcer") once per test binary and returns the executable's path. The binaries
// live in a folder removed by Cleanup.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	out, err := BuildPkg(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// BuildPkg is Build for a program that is not a test (a bench that runs a helper process): it
// returns the error instead of failing a test.
func BuildPkg(pkg string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[pkg]; ok {
		return p, nil
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "kds-host-testbin-")
		if err != nil {
			return "", err
		}
		dir = d
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out, nil
}

// Cleanup removes the built binaries; call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
	}
	dir, built = "", map[string]string{}
}

// ModuleRoot is the folder of the repository's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

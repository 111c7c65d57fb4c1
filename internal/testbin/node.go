package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// NodePluginDir is the Node.js example plugin's folder, from the module root.
const NodePluginDir = "examples/plugins/node-retry"

// NodePlugin returns the path of the Node.js example plugin (its plugin.js), with its
// dependencies installed: when node_modules is missing or older than package-lock.json it runs
// `npm ci` once, under a file lock, as `make example-plugins` does. Without node or npm the test
// is skipped with the reason, or fails when CI is set (CI=true: a CI machine must have them).
func NodePlugin(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := tool + " is not installed (Debian: apt-get install nodejs npm): the Node.js example plugin cannot run"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, NodePluginDir)
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	// Test binaries of several packages run at once; one npm ci at a time.
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if !installed(dir) {
		cmd := exec.Command("npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return filepath.Join(dir, "plugin.js")
}

// installed reports whether npm ci has run since package-lock.json last changed: npm writes
// node_modules/.package-lock.json as it installs.
func installed(dir string) bool {
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return false
	}
	done, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	return err == nil && !done.ModTime().Before(lock.ModTime())
}

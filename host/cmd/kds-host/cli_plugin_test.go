package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
)

// buildExample builds the example plugin examples/plugins/fixed-retry into a temporary folder.
func buildExample(t *testing.T) string {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "fixed-retry")
	cmd := exec.Command("go", "build", "-o", out, "./examples/plugins/fixed-retry")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func TestPluginVerify(t *testing.T) {
	path := buildExample(t)

	t.Run("a correct plugin passes", func(t *testing.T) {
		g := NewWithT(t)
		res := runCLI(t, "", "plugin", "verify", path,
			"--config", writeFile(t, "policy.yaml", "delay: 200ms\nmaxAttempts: 0\n"),
			"--give-up-config", writeFile(t, "give-up.yaml", "delay: 200ms\nmaxAttempts: 2\n"))
		g.Expect(res.err).NotTo(HaveOccurred(), res.stdout)
		g.Expect(res.stdout).To(ContainSubstring("✓ handshake"))
		g.Expect(res.stdout).To(ContainSubstring("checks run under --config"))
		g.Expect(res.stdout).To(ContainSubstring("gave up at round 2"))
		g.Expect(res.stdout).To(ContainSubstring("PASS: 16 checks, 16 passed"))
	})

	t.Run("a document the plugin refuses fails the run", func(t *testing.T) {
		g := NewWithT(t)
		res := runCLI(t, "", "plugin", "verify", path, "--config", writeFile(t, "bad.yaml", "delay: soon\n"))
		g.Expect(res.err).To(MatchError(ContainSubstring("checks failed: retry-forcer/configure")))
		g.Expect(res.stdout).To(ContainSubstring("✗ retry-forcer/configure "))
		g.Expect(res.stdout).To(ContainSubstring("--config"))
	})

	t.Run("a missing binary fails the handshake", func(t *testing.T) {
		g := NewWithT(t)
		res := runCLI(t, "", "plugin", "verify", filepath.Join(t.TempDir(), "nope"))
		g.Expect(res.err).To(MatchError(ContainSubstring("handshake")))
		g.Expect(res.stdout).To(ContainSubstring("no such file"))
	})

	t.Run("a missing --config file is an error before anything runs", func(t *testing.T) {
		g := NewWithT(t)
		res := runCLI(t, "", "plugin", "verify", path, "--config", filepath.Join(t.TempDir(), "nope.yaml"))
		g.Expect(res.err).To(MatchError(ContainSubstring("--config")))
		g.Expect(res.stdout).To(BeEmpty())
	})
}

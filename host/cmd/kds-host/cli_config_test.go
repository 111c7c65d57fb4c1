package main

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

func TestNamedControlPlanes(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("KDS_CP", "")
	os.Unsetenv("KDS_CP")
	cp := newGlobalAPI(t)
	other := newGlobalAPI(t)

	r := runCLI(t, "", "config", "control-planes", "add", "--name", "lab", "--address", cp, "--token", "t0ken")
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	r = runCLI(t, "", "config", "control-planes", "add", "--name", "other", "--address", other)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	r = runCLI(t, "", "config", "control-planes", "add", "--name", "lab", "--address", cp)
	g.Expect(r.err).To(MatchError(ContainSubstring("--overwrite")))
	r = runCLI(t, "", "config", "control-planes", "switch", "--name", "lab")
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	r = runCLI(t, "", "config", "control-planes", "list")
	g.Expect(r.stdout).To(MatchRegexp(`\*\s+lab\s+` + cp))

	// Without --cp, a client command talks to the current control plane.
	r = runCLI(t, "", "apply", "-f", writeFile(t, "m.yaml", "type: Mesh\nname: on-lab\n"))
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	r = runCLI(t, "", "get", "mesh", "on-lab", "--cp", other)
	g.Expect(r.err).To(HaveOccurred(), "--cp still wins")
	r = runCLI(t, "", "get", "mesh", "on-lab")
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)

	r = runCLI(t, "", "config", "control-planes", "switch", "--name", "nope")
	g.Expect(r.err).To(MatchError(ContainSubstring(`no control plane "nope"`)))
	path := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "kds-host", "config.yaml")
	st, err := os.Stat(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o600)), "it holds tokens")
	r = runCLI(t, "", "config", "control-planes", "remove", "--name", "lab")
	g.Expect(r.err).NotTo(HaveOccurred())
	r = runCLI(t, "", "config", "control-planes", "list")
	g.Expect(r.stdout).NotTo(ContainSubstring("lab"))
}

package main

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// The CLI against a real global (the binary): without a token it is told how to get one; on
// the global's machine it finds the admin token under --data-dir by itself; a read-only token
// minted with `kds-host token user` may read and not write.
func TestTheCLIUsesTheGlobalsTokens(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("KDS_TOKEN", "")
	h := startHost(t)
	cp := "http://" + h.apiAddr
	mesh := writeFile(t, "mesh.yaml", "type: Mesh\nname: default\n")

	r := runCLI(t, "", "apply", "-f", mesh, "--cp", cp, "--data-dir", t.TempDir())
	g.Expect(r.err).To(MatchError(ContainSubstring("this API needs a token")))
	g.Expect(r.err.Error()).To(ContainSubstring("admin.token"))

	r = runCLI(t, "", "apply", "-f", mesh, "--cp", cp, "--data-dir", h.dataDir)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring(`mesh "default" created`))

	r = runCLI(t, "", "token", "user", "--name", "ops", "--group", "read-only", "--cp", cp, "--data-dir", h.dataDir)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	reader := strings.TrimSpace(r.stdout)
	g.Expect(reader).To(HavePrefix("kds1."))

	t.Setenv("KDS_TOKEN", reader)
	r = runCLI(t, "", "get", "meshes", "--cp", cp, "--data-dir", t.TempDir())
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(ContainSubstring("default"))
	r = runCLI(t, "", "delete", "mesh", "default", "--cp", cp, "--data-dir", t.TempDir())
	g.Expect(r.err).To(MatchError(ContainSubstring("may only read")))

	tokenFile := writeFile(t, "zone.token", "")
	r = runCLI(t, "", "token", "zone", "--name", "zone-7", "--valid-for", "24h", "--cp", cp, "--token-file", tokenFile)
	g.Expect(r.err).To(MatchError(ContainSubstring("is empty")), "--token-file wins over KDS_TOKEN, and says what is wrong")
}

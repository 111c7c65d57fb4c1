package main

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
)

// saysNoAutoMTLS holds a message about a plugin without AutoMTLS to what plugin verify says of
// it: it names AutoMTLS, what to implement and the section of the protocol document, and keeps
// the TLS error a person would search for.
func saysNoAutoMTLS(g Gomega, msg string) {
	g.Expect(msg).To(And(ContainSubstring("no AutoMTLS: the plugin serves plaintext gRPC on unix "),
		ContainSubstring("Implement AutoMTLS"), ContainSubstring("PLUGIN_CLIENT_CERT"),
		ContainSubstring("docs/plugin-protocol.md#automtls"),
		ContainSubstring("tls: first record does not look like a TLS handshake")))
}

// TestAPluginWithoutAutoMTLSIsRefusedByName: a plugin that answers the handshake but serves
// plaintext (shared/conformance/testdata/no-mtls, as a first hand-written plugin does) stops the
// host at start with a message that names AutoMTLS and the section to read, as plugin verify
// does, not only "tls: first record does not look like a TLS handshake"; a reload to it is
// refused with the same message, which inspect plugins shows.
func TestAPluginWithoutAutoMTLSIsRefusedByName(t *testing.T) {
	noMTLS := testbin.Build(t, "./shared/conformance/testdata/no-mtls")

	t.Run("at start", func(t *testing.T) {
		g := NewWithT(t)
		ports := freePorts(t, 3)
		cmd := exec.Command(testbin.Build(t, "./host/cmd/kds-host"), "--data-dir", t.TempDir(), "--kds-plaintext",
			"--kds-addr", ports[0], "--api-addr", ports[1], "--diag-addr", ports[2], "--plugin", noMTLS)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		g.Expect(errors.As(err, &exit)).To(BeTrue(), "want a non-zero exit, got %v: %s", err, out)
		g.Expect(exit.ExitCode()).To(Equal(1))
		g.Expect(string(out)).To(ContainSubstring("Error: plugin " + noMTLS + ": no AutoMTLS"))
		saysNoAutoMTLS(g, string(out))
	})

	t.Run("on reload, and in inspect plugins", func(t *testing.T) {
		g := NewWithT(t)
		cfgFile := filepath.Join(t.TempDir(), "kds-host.yaml")
		g.Expect(os.WriteFile(cfgFile, []byte("plugins:\n  - path: builtin\n"), 0o600)).To(Succeed())
		h := startHost(t, "--config", cfgFile)
		g.Expect(os.WriteFile(cfgFile, []byte("plugins:\n  - path: "+noMTLS+"\n"), 0o600)).To(Succeed())
		code, body := h.reloadByAPI(t)
		g.Expect(code).To(Equal(http.StatusUnprocessableEntity), body)
		saysNoAutoMTLS(g, h.plugins(t).LastReload.Error)
		res := runCLI(t, "", "inspect", "plugins", "--cp", "http://"+h.apiAddr, "--data-dir", h.dataDir)
		g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
		g.Expect(res.stdout).To(ContainSubstring("failed, the running plugins stayed: plugin " + noMTLS + ": no AutoMTLS"))
		saysNoAutoMTLS(g, res.stdout)
	})
}

// TestAScriptPluginPinnedByItsFolder: `kds-host plugin checksum --folder` prints the --plugin
// value that pins a script plugin with the files beside it (issue 25: a pin of the launcher
// covered only the launcher), and a host runs it.
func TestAScriptPluginPinnedByItsFolder(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	bin, err := os.ReadFile(testbin.Build(t, "./plugins/retry-forcer"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(dir, "retry-forcer"), bin, 0o755)).To(Succeed())
	launcher := filepath.Join(dir, "plugin.sh")
	g.Expect(os.WriteFile(launcher, []byte("#!/bin/sh\nexec \"$(dirname \"$0\")/retry-forcer\"\n"), 0o755)).To(Succeed())

	res := runCLI(t, "", "plugin", "checksum", "--folder", launcher)
	g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
	pin := strings.TrimSpace(res.stdout)
	g.Expect(pin).To(MatchRegexp(`^` + regexpQuote(launcher) + `@sha256-folder:[0-9a-f]{64}$`))
	res = runCLI(t, "", "plugin", "checksum", launcher)
	g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
	g.Expect(strings.TrimSpace(res.stdout)).To(MatchRegexp(`^` + regexpQuote(launcher) + `@sha256:[0-9a-f]{64}$`))

	h := startHost(t, "--plugin", pin)
	g.Expect(pluginNamed(h.plugins(t), "retry-forcer").State).To(Equal("running"))
}

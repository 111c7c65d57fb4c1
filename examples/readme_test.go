// Package examples_test keeps the README's plugin example true: it builds the Go block of
// README.md and runs the conformance suite against it.
package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/shared/conformance"
)

func TestREADMEPluginBuildsAndPassesConformance(t *testing.T) {
	g := NewWithT(t)
	root, err := testbin.ModuleRoot()
	g.Expect(err).NotTo(HaveOccurred())
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	g.Expect(err).NotTo(HaveOccurred())
	_, rest, ok := strings.Cut(string(readme), "A complete custom retry plugin")
	g.Expect(ok).To(BeTrue(), "README.md lost its plugin example")
	_, code, ok := strings.Cut(rest, "```go\n")
	g.Expect(ok).To(BeTrue())
	code, _, ok = strings.Cut(code, "```")
	g.Expect(ok).To(BeTrue())
	lines := 0
	for _, l := range strings.Split(code, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "//") {
			lines++
		}
	}
	g.Expect(lines).To(BeNumerically("<", 40), "the README promises a plugin in under 40 lines")

	// Inside the module, so it builds against this checkout's shared/ and proto/.
	dir, err := os.MkdirTemp(filepath.Join(root, "examples"), "readme-plugin-")
	g.Expect(err).NotTo(HaveOccurred())
	defer os.RemoveAll(dir)
	g.Expect(os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644)).To(Succeed())
	bin := filepath.Join(t.TempDir(), "readme-plugin")
	cmd := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(dir))
	cmd.Dir = filepath.Join(root, "examples")
	out, err := cmd.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "%s", out)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	report := conformance.Run(ctx, conformance.Options{Path: bin})
	var sb strings.Builder
	report.Write(&sb)
	g.Expect(report.Passed()).To(BeTrue(), sb.String())
}

// Package examples_test keeps the plugin examples of the documentation true: it builds the Go
// block of README.md and runs the conformance suite against it, and runs docs/writing-a-plugin.md
// as printed.
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

// block returns the body of the first fenced block of lang after marker in doc.
func block(t *testing.T, doc, marker, lang string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, marker)
	if !ok {
		t.Fatalf("the document lost %q", marker)
	}
	_, body, ok := strings.Cut(rest, "```"+lang+"\n")
	if !ok {
		t.Fatalf("no ```%s block after %q", lang, marker)
	}
	body, _, ok = strings.Cut(body, "```\n")
	if !ok {
		t.Fatalf("the ```%s block after %q does not end", lang, marker)
	}
	return body
}

// checkLines are a report's check lines without their durations: "✓ name  summary".
func checkLines(report string) []string {
	var out []string
	for _, l := range strings.Split(report, "\n") {
		if !strings.HasPrefix(l, "✓ ") && !strings.HasPrefix(l, "✗ ") && !strings.HasPrefix(l, "· ") && !strings.HasPrefix(l, "- ") {
			continue
		}
		if i := strings.LastIndex(l, " ("); i > 0 {
			l = l[:i]
		}
		out = append(out, l)
	}
	return out
}

// TestWritingAPluginIsTrue holds docs/writing-a-plugin.md to what it prints: its program is
// examples/plugins/fixed-retry/main.go byte for byte, the commands of its step 4 run as printed
// (from the module root) and give the report it shows, check by check, and the failure it shows
// is what the suite reports for a negative delay.
func TestWritingAPluginIsTrue(t *testing.T) {
	g := NewWithT(t)
	root, err := testbin.ModuleRoot()
	g.Expect(err).NotTo(HaveOccurred())
	b, err := os.ReadFile(filepath.Join(root, "docs", "writing-a-plugin.md"))
	g.Expect(err).NotTo(HaveOccurred())
	doc := string(b)

	code := block(t, doc, "This is `examples/plugins/fixed-retry/main.go`:", "go")
	example, err := os.ReadFile(filepath.Join(root, "examples", "plugins", "fixed-retry", "main.go"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(string(example)), "the page's program is the example, byte for byte")

	commands := block(t, doc, "### 4. Build and verify it", "sh")
	var out []byte
	for _, line := range strings.Split(strings.TrimSpace(commands), "\n") {
		cmd := exec.Command("bash", "-c", line)
		cmd.Dir = root
		out, err = cmd.CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), "%s:\n%s", line, out)
	}
	printed := block(t, doc, "For a correct plugin it takes well under a", "text")
	g.Expect(checkLines(string(out))).To(Equal(checkLines(printed)), "the report the page prints:\n%s", out)
	g.Expect(checkLines(printed)).To(HaveLen(16))
	summary := func(s string) string {
		i := strings.Index(s, "PASS: ")
		g.Expect(i).To(BeNumerically(">=", 0), s)
		line, _, _ := strings.Cut(s[i:], ", in ")
		return line
	}
	g.Expect(summary(string(out))).To(Equal(summary(printed)))

	failure := block(t, doc, "A Schedule that\nreturns a negative delay, for example:", "text")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	report := conformance.Run(ctx, conformance.Options{Path: testbin.Build(t, "./shared/conformance/testdata/negative-delay")})
	var sb strings.Builder
	g.Expect(report.Write(&sb)).To(Succeed())
	for _, l := range strings.Split(strings.TrimSpace(failure), "\n") {
		if i := strings.LastIndex(l, " ("); i > 0 && strings.HasSuffix(l, ")") && !strings.HasPrefix(l, " ") {
			l = l[:i] // the check line's duration
		}
		g.Expect(sb.String()).To(ContainSubstring(l))
	}
}

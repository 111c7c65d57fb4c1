package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func writeDoc(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	NewWithT(t).Expect(os.WriteFile(path, []byte(doc), 0o600)).To(Succeed())
	return path
}

func TestNewForcer(t *testing.T) {
	cases := []struct {
		name string
		path func(t *testing.T) string
		want retrypolicy.Config
		err  string
	}{
		{name: "no config file", path: func(*testing.T) string { return "" }, want: retrypolicy.Default()},
		{name: "a good file", path: func(t *testing.T) string { return writeDoc(t, "policy: fixed\ndelay: 2s\n") },
			want: retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: 2 * time.Second}},
		{name: "a bad file", path: func(t *testing.T) string { return writeDoc(t, "factor: 0.5\n") },
			err: "policy.yaml: factor: must be >= 1, got 0.5"},
		{name: "a missing file", path: func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.yaml") },
			err: "KDS_RETRY_FORCER_CONFIG: open "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			f, err := newForcer(tc.path(t))
			if tc.err != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(f.Config()).To(Equal(tc.want))
		})
	}
}

// TestMainExitsOnABadConfig runs main in a child process: a bad policy document is a clear
// message on stderr and exit status 1, before the plugin starts serving.
func TestMainExitsOnABadConfig(t *testing.T) {
	if os.Getenv("RETRY_FORCER_RUN_MAIN") == "1" {
		main()
		return
	}
	g := NewWithT(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainExitsOnABadConfig$")
	cmd.Env = append(os.Environ(), "RETRY_FORCER_RUN_MAIN=1", configEnv+"="+writeDoc(t, "policy: foo\n"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	g.Expect(err).To(BeAssignableToTypeOf(exit))
	g.Expect(cmd.ProcessState.ExitCode()).To(Equal(1))
	g.Expect(string(out)).To(ContainSubstring(`retry-forcer: KDS_RETRY_FORCER_CONFIG=`))
	g.Expect(string(out)).To(ContainSubstring(`policy: unknown policy "foo" (exponential, fixed, decorrelated)`))
}

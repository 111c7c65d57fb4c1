package launch_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func retryForcerBin(t testing.TB) string { return testbin.Build(t, "./plugins/retry-forcer") }

// fixture is a broken plugin from the conformance suite's testdata.
func fixture(t testing.TB, name string) string {
	return testbin.Build(t, "./shared/conformance/testdata/"+name)
}

// start starts a plugin and kills it when the test ends.
func start(t *testing.T, opts launch.Options) *launch.Process {
	t.Helper()
	p, err := launch.Start(t.Context(), opts)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// describe asks the plugin's RetryForcer for its name.
func describe(p *launch.Process) (string, error) {
	rpc, err := p.Client().Client()
	if err != nil {
		return "", err
	}
	raw, err := rpc.Dispense(shared.RetryForcerName)
	if err != nil {
		return "", err
	}
	d, err := raw.(shared.RetryForcer).Describe(context.Background())
	return d.GetName(), err
}

// running reports whether a process runs: it exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) && syscall.Kill(pid, 0) == nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func TestStartAndKill(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	p := start(t, launch.Options{Path: bin})
	g.Expect(p.Pid()).To(BeNumerically(">", 0))
	g.Expect(running(p.Pid())).To(BeTrue())
	g.Expect(p.Exited()).To(BeFalse())
	g.Expect(p.Client().NegotiatedVersion()).To(Equal(shared.ProtocolVersion))
	g.Expect(p.Client().Protocol()).To(Equal(plugin.ProtocolGRPC))
	g.Expect(describe(p)).To(Equal("retry-forcer"))
	sum, err := p.Checksum()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sum).To(MatchRegexp(`^[0-9a-f]{64}$`))

	g.Expect(p.Kill()).To(Succeed(), "it exits when asked")
	g.Expect(p.Exited()).To(BeTrue())
	g.Expect(running(p.Pid())).To(BeFalse(), "gone when Kill returns")
	g.Expect(p.Kill()).To(Succeed(), "a second Kill says the same")
}

func TestAPluginThatDoesNotExitWhenAskedIsForcedAndSaysSo(t *testing.T) {
	g := NewWithT(t)
	p := start(t, launch.Options{Path: fixture(t, "ignores-shutdown")})
	err := p.Kill()
	g.Expect(err).To(MatchError(launch.ErrForcedKill))
	g.Expect(running(p.Pid())).To(BeFalse())
}

func TestAStoppedPluginIsSIGKILLedAfterTheKillTimeout(t *testing.T) {
	g := NewWithT(t)
	// Far below go-plugin's own 2s wait before it SIGKILLs: the launcher's kill comes first.
	p := start(t, launch.Options{Path: retryForcerBin(t), KillTimeout: 10 * time.Millisecond})
	g.Expect(syscall.Kill(p.Pid(), syscall.SIGSTOP)).To(Succeed())
	err := p.Kill()
	g.Expect(err).To(MatchError(launch.ErrKillTimeout))
	g.Expect(err.Error()).To(ContainSubstring("the process group was SIGKILLed (after 10ms)"))
	g.Expect(running(p.Pid())).To(BeFalse())
}

func TestAHostThatOffersAnotherVersionIsRefused(t *testing.T) {
	g := NewWithT(t)
	_, err := launch.Start(t.Context(), launch.Options{Path: retryForcerBin(t),
		Plugins: map[int]plugin.PluginSet{shared.ProtocolVersion + 1: shared.ClientPluginSets()[shared.ProtocolVersion]}})
	g.Expect(err).To(MatchError(launch.ErrNotAPlugin))
	g.Expect(err.Error()).To(ContainSubstring("incompatible API version with plugin"))
}

func TestStartErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts launch.Options
		is   error
		says string
	}{
		{"a program that exits at once", launch.Options{Path: "/bin/true"}, launch.ErrNotAPlugin,
			"plugin /bin/true: not a kds-host plugin (it must answer the go-plugin handshake with kds-host's cookie and protocol version 1): it exited without a handshake"},
		{"a go-plugin plugin with another cookie", launch.Options{Path: fixture(t, "wrong-cookie")}, launch.ErrNotAPlugin,
			"it exited without a handshake; its stderr: This binary is a plugin."},
		{"no such file", launch.Options{Path: "/nonexistent/plugin"}, os.ErrNotExist, "plugin /nonexistent/plugin: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := launch.Start(t.Context(), tc.opts)
			g.Expect(err).To(MatchError(tc.is))
			g.Expect(err.Error()).To(ContainSubstring(tc.says))
		})
	}

	t.Run("a wrong checksum", func(t *testing.T) {
		g := NewWithT(t)
		_, err := launch.Start(t.Context(), launch.Options{Path: retryForcerBin(t), SHA256: make([]byte, 32)})
		var ce *launch.ChecksumError
		g.Expect(errors.As(err, &ce)).To(BeTrue(), "got %v", err)
		g.Expect(ce.Expected).To(Equal(strings.Repeat("0", 64)))
		g.Expect(ce.Actual).To(MatchRegexp(`^[0-9a-f]{64}$`))
	})
}

// socketsIn lists the unix sockets under dir, at any depth.
func socketsIn(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 {
			out = append(out, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shortTempDir is a fresh temporary folder with a short path (a unix socket's path has at most
// 104 to 108 bytes), removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestAPluginLeavesNoSocket: a plugin's socket goes in a private folder that is removed once
// the process is gone, however it ended. Issue 25: a plugin refused for its protocol version is
// SIGKILLed by go-plugin without Shutdown, and its socket stayed in TMPDIR.
func TestAPluginLeavesNoSocket(t *testing.T) {
	bin := retryForcerBin(t)
	for _, tc := range []struct {
		name string
		run  func(g Gomega, opts launch.Options)
	}{
		{"refused for its protocol version", func(g Gomega, opts launch.Options) {
			opts.Plugins = map[int]plugin.PluginSet{shared.ProtocolVersion + 1: shared.ClientPluginSets()[shared.ProtocolVersion]}
			_, err := launch.Start(t.Context(), opts)
			g.Expect(err).To(MatchError(ContainSubstring("incompatible API version")))
		}},
		{"stopped by Kill", func(g Gomega, opts launch.Options) {
			p, err := launch.Start(t.Context(), opts)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(socketsIn(t, opts.CopyDir)).To(HaveLen(1), "its socket, while it runs")
			g.Expect(p.Kill()).To(Succeed())
		}},
		{"SIGKILLed", func(g Gomega, opts launch.Options) {
			p, err := launch.Start(t.Context(), opts)
			g.Expect(err).NotTo(HaveOccurred())
			// Connected, as the host is before a plugin can crash under it. (go-plugin's Kill of
			// a dead plugin it never connected to leaks the connection it then makes.)
			_, err = p.Client().Client()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(syscall.Kill(p.Pid(), syscall.SIGKILL)).To(Succeed())
			g.Eventually(p.Exited, 10*time.Second, 10*time.Millisecond).Should(BeTrue())
			g.Expect(socketsIn(t, opts.CopyDir)).To(HaveLen(1), "a SIGKILLed plugin leaves its socket")
			_ = p.Kill()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			// The plugin's TMPDIR, where a go-plugin plugin puts its socket unless told otherwise,
			// is the launcher's folder too.
			tmp := shortTempDir(t)
			t.Setenv("TMPDIR", tmp)
			tc.run(g, launch.Options{Path: bin, CopyDir: tmp})
			entries, err := os.ReadDir(tmp)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(entries).To(BeEmpty(), "nothing of the plugin is left in %s", tmp)
		})
	}
}

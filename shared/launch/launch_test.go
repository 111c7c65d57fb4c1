package launch_test

import (
	"context"
	"errors"
	"os"
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

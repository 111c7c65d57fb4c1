package policy_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/internal/hclogslog"
	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
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

// patience is how long a test waits for what must happen with real processes before it calls
// it a hang. It is no claim on how long anything takes: the tests assert order and counts, and
// the exact timing is the supervisor's, tested with synctest (supervisor_test.go).
const patience = time.Minute

// Fixture binaries.
func retryForcerBin(t testing.TB) string { return testbin.Build(t, "./plugins/retry-forcer") }
func ownerCheckBin(t testing.TB) string  { return testbin.Build(t, "./plugins/owner-check") }
func bothBin(t testing.TB) string        { return testbin.Build(t, "./policy/testdata/both") }

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// hostLogger is the runtime's logger in kds-host: slog records written to an hclog logger.
func hostLogger(o *hclog.LoggerOptions) *slog.Logger { return slog.New(hclogslog.New(hclog.New(o))) }

// testLogger logs to stderr with KDS_TEST_LOG set, else nowhere.
func testLogger() *slog.Logger {
	if os.Getenv("KDS_TEST_LOG") == "" {
		return nil
	}
	return hostLogger(&hclog.LoggerOptions{Name: "kds-host", Level: hclog.Debug})
}

// config is a runtime config for tests, with kds-host's metrics namespace: short probes and
// backoff, a generous start timeout.
func config(list ...policy.Spec) policy.Config {
	return policy.Config{
		Plugins: policy.Plugins{List: list},
		Options: policy.Options{
			Logger:        testLogger(),
			Metrics:       policy.Metrics{Namespace: "kds"},
			StartTimeout:  10 * time.Second,
			CallTimeout:   200 * time.Millisecond,
			ProbeInterval: 100 * time.Millisecond,
			BackoffMin:    50 * time.Millisecond,
		},
	}
}

func doc(text string) *policy.Document {
	return &policy.Document{Source: "test", Data: []byte(text)}
}

// start runs a runtime until the test ends.
func start(t testing.TB, cfg policy.Config) *policy.Runtime {
	t.Helper()
	rt, err := policy.New(cfg)
	if err != nil {
		t.Fatalf("policy.New: %v", err)
	}
	t.Cleanup(rt.Close)
	return rt
}

// static reads p, for Reload.
func static(p policy.Plugins) func() (policy.Plugins, error) {
	return func() (policy.Plugins, error) { return p, nil }
}

// statusOf returns the status of the plugin named name.
func statusOf(rt *policy.Runtime, name string) policy.Status {
	for _, s := range rt.Status() {
		if s.Name == name {
			return s
		}
	}
	return policy.Status{}
}

var scheduleReq = &pluginv1.ScheduleRequest{Zone: "zone-1", Round: 2,
	Failing: []*pluginv1.FailingKind{{Kind: "Mesh", RejectedNames: []string{"default"}}}}

var predictReq = &pluginv1.PredictRequest{Zone: "zone-1", Candidates: []*kdsv1.Resource{
	{Kind: "Mesh", Name: "default"}, {Kind: "MeshTimeout", Mesh: "default", Name: "t"}}}

// schedule asks the runtime's retry policy for a delay.
func schedule(rt *policy.Runtime) (time.Duration, error) {
	resp, err := rt.RetryForcer().Schedule(context.Background(), scheduleReq)
	return resp.GetDelay().AsDuration(), err
}

// alive reports whether a process runs (a zombie does not).
func alive(pid int) bool {
	if pid <= 0 || errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

var _ = NewWithT

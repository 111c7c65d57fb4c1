package policy_test

import (
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/serial"
	"github.com/kds-host/kds-host/policy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// metricSum sums a runtime metric over its label sets.
func metricSum(t *testing.T, rt *policy.Runtime, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rt.Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// rejectingZone stands in for a zone stream's session (stream 1) that NACKs Mesh "default"
// every time it is sent: each retry round ends in a NACK, which asks the policy for the next
// round.
type rejectingZone struct {
	serial.Queue
	retry  retry.Stream
	sched  *retry.Scheduler
	mu     sync.Mutex
	rounds int
}

func (z *rejectingZone) Retry() *retry.Stream { return &z.retry }

func (z *rejectingZone) Resend(map[string][]string) {
	z.mu.Lock()
	z.rounds++
	z.mu.Unlock()
	z.nack(1)
}

func (z *rejectingZone) nack(id int64) {
	z.sched.Observer().NACK(event.NACK{StreamID: id, Node: "zone-1", TypeURL: "Mesh",
		Rejected: []event.Rejection{{Name: "default", Version: "v1"}}})
}

func (z *rejectingZone) roundsSoFar() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.rounds
}

func TestAStoppedPluginTimesOutAndIsReplaced(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := NewWithT(t)
	cfg := config(
		policy.Spec{Path: retryForcerBin(t), Document: doc("policy: fixed\ndelay: 30ms\n")},
		policy.Spec{Path: policy.Builtin, Document: doc("policy: fixed\ndelay: 40ms\n")},
	)
	cfg.ProbeInterval = time.Hour // the scheduler's calls alone find the hang
	rt, err := policy.New(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	defer rt.Close()

	var fallbacks atomic.Int64
	zone := &rejectingZone{}
	zone.sched, err = retry.NewScheduler(retry.Config{
		Policy: retry.Standard(rt.RetryForcer, rt.Fallback(), retry.StandardConfig{Timeout: 200 * time.Millisecond,
			OnFallback: func(*pluginv1.ScheduleRequest, error) { fallbacks.Add(1) }}),
		Sessions: func(int64) retry.Session { return zone },
	})
	g.Expect(err).NotTo(HaveOccurred())
	defer zone.sched.Close()
	zone.sched.Observer().StreamOpened(1, "zone-1")
	zone.nack(1)
	g.Eventually(zone.roundsSoFar, patience).Should(BeNumerically(">=", 3))
	g.Expect(fallbacks.Load()).To(BeZero())

	old := statusOf(rt, "retry-forcer")
	g.Expect(syscall.Kill(old.PID, syscall.SIGSTOP)).To(Succeed())

	// The calls time out, the built-in policy decides meanwhile, and after three timeouts in a
	// row the plugin is taken for hung and replaced by a new process.
	g.Eventually(func() string { return statusOf(rt, "retry-forcer").State }, patience, 5*time.Millisecond).
		Should(Equal(policy.StateRestarting))
	g.Eventually(func() int { return statusOf(rt, "retry-forcer").PID }, patience, 5*time.Millisecond).
		ShouldNot(Or(BeZero(), Equal(old.PID)))
	now := statusOf(rt, "retry-forcer")
	g.Expect(now.State).To(Equal(policy.StateRunning))
	g.Expect(now.Restarts).To(Equal(1))
	g.Expect(now.Timeouts).To(BeNumerically(">=", 3))
	g.Expect(now.LastError).To(ContainSubstring("hung: 3 calls in a row missed their 200ms deadline"))
	g.Expect(fallbacks.Load()).To(BeNumerically(">=", 3))
	g.Expect(statusOf(rt, policy.Builtin).Calls).To(BeNumerically(">=", 3))

	// The stopped process is SIGKILLed once go-plugin's Kill has hung for the kill timeout.
	g.Eventually(func() bool { return alive(old.PID) }, patience).Should(BeFalse())

	// Prometheus sees the same.
	g.Expect(metricSum(t, rt, "kds_plugin_call_timeouts_total")).To(BeNumerically(">=", 3))
	g.Expect(metricSum(t, rt, "kds_plugin_call_errors_total")).To(BeNumerically(">=", 3))
	g.Expect(metricSum(t, rt, "kds_plugin_restarts_total")).To(Equal(1.0))
	g.Expect(metricSum(t, rt, "kds_plugin_up")).To(Equal(2.0), "retry-forcer and builtin")

	// The new process decides again.
	g.Eventually(func() uint64 { return statusOf(rt, "retry-forcer").Calls }, patience).Should(BeNumerically(">=", now.Calls+5))

	zone.sched.Close()
	rt.Close()
	g.Eventually(func() bool { return alive(now.PID) }, patience).Should(BeFalse())
}

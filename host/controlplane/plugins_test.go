package controlplane_test

import (
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/plugins"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/retry"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/internal/testbin"
)

// startRuntime runs the plugin runtime with list until the test ends.
func startRuntime(t testing.TB, list ...plugins.Spec) *plugins.Runtime {
	t.Helper()
	rt, err := plugins.New(plugins.Config{Plugins: plugins.Plugins{List: list}, Logger: logger(t, "global"), CallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

// withRuntime wires a global to the plugin runtime as kds-host does.
func withRuntime(rt *plugins.Runtime) func(*controlplane.GlobalConfig) {
	return func(c *controlplane.GlobalConfig) {
		c.RetryPolicy, c.Builtin, c.OwnerCheck = rt.RetryForcer, rt.Fallback(), rt.OwnerCheck
		c.Collectors = rt.Collectors()
		// Generous: on a loaded machine a decision must not fall back by accident.
		c.PolicyTimeout = time.Second
	}
}

func pluginStatus(rt *plugins.Runtime, name string) plugins.Status {
	for _, s := range rt.Status() {
		if s.Name == name {
			return s
		}
	}
	return plugins.Status{}
}

func retryState(gl *controlplane.Global) retry.StreamState {
	for _, v := range gl.ZoneViews() {
		if v.Retry != nil {
			return *v.Retry
		}
	}
	return retry.StreamState{}
}

func document(text string) *plugins.Document {
	return &plugins.Document{Source: "test", Data: []byte(text)}
}

func TestAKilledPluginIsRestartedWhileZonesStayConnectedAndRoundsGoOn(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	// The plugin's rounds are 60ms apart, the built-in policy's 150ms: the delays say who decided.
	rt := startRuntime(t,
		plugins.Spec{Path: testbin.Build(t, "./plugins/retry-forcer"), Document: document("policy: fixed\ndelay: 60ms\n")},
		plugins.Spec{Path: plugins.Builtin, Document: document("policy: fixed\ndelay: 150ms\n")},
	)
	gl := startGlobal(t, gst, reg, withRuntime(rt))
	z := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Hour}
	})

	// The zone NACKs Mesh again and again; the plugin decides every round.
	g.Eventually(func() uint32 { return retryState(gl.Global).Round }, 10*time.Second).Should(BeNumerically(">=", 3))
	g.Expect(retryState(gl.Global).LastDelay).To(Equal("60ms"))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total")).To(BeZero())
	stream := gl.ZoneViews()[0].Stream

	// Kill the plugin while a round is pending.
	var pending retry.StreamState
	g.Eventually(func() *time.Time { pending = retryState(gl.Global); return pending.NextRetry }, time.Second, time.Millisecond).ShouldNot(BeNil())
	old := pluginStatus(rt, "retry-forcer")
	g.Expect(syscall.Kill(old.PID, syscall.SIGKILL)).To(Succeed())
	killed := time.Now()

	// The pending round fires, and the decision after it is the built-in policy's.
	g.Eventually(func() uint32 { return retryState(gl.Global).Round }, 2*time.Second, time.Millisecond).Should(BeNumerically(">", pending.Round))
	g.Eventually(func() float64 { return metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total") }, 2*time.Second, 10*time.Millisecond).
		Should(BeNumerically(">=", 1))

	// The plugin is back within 2 s, a new process, and decides again.
	g.Eventually(func() string { return pluginStatus(rt, "retry-forcer").State }, 2*time.Second-time.Since(killed), 5*time.Millisecond).
		Should(Equal(plugins.StateRunning))
	restarted := time.Since(killed)
	now := pluginStatus(rt, "retry-forcer")
	g.Expect(now.PID).NotTo(Equal(old.PID))
	g.Expect(now.Restarts).To(Equal(1))
	t.Logf("plugin restarted %s after kill -9", restarted.Round(time.Millisecond))
	fallbacks := metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total")
	round := retryState(gl.Global).Round
	g.Eventually(func() uint32 { return retryState(gl.Global).Round }, 2*time.Second).Should(BeNumerically(">=", round+3))
	g.Expect(retryState(gl.Global).LastDelay).To(Equal("60ms"))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total")).To(Equal(fallbacks))
	g.Expect(metric(t, gl.DiagAddr(), "kds_plugin_restarts_total")).To(Equal(1.0))
	g.Expect(metric(t, gl.DiagAddr(), "kds_plugin_calls_total")).To(BeNumerically(">", 3))

	// The zone's stream never dropped.
	g.Expect(z.Client.Stats().Sessions).To(Equal(1))
	views := gl.ZoneViews()
	g.Expect(views).To(HaveLen(1))
	g.Expect(views[0].Connected).To(BeTrue())
	g.Expect(views[0].Stream).To(Equal(stream))
}

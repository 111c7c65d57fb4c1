package controlplane_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
)

// startRuntime runs the plugin runtime with list until the test ends.
func startRuntime(t testing.TB, list ...policy.Spec) *policy.Runtime {
	t.Helper()
	o := controlplane.PluginOptions(logger(t, "global"))
	o.CallTimeout = time.Second
	rt, err := policy.New(policy.Config{Plugins: policy.Plugins{List: list}, Options: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	return rt
}

// patience is how long a test waits for what must happen with real processes before it calls
// it a hang. It is no claim on how long anything takes: the tests assert order and counts.
const patience = time.Minute

// withRuntime wires a global to the plugin runtime as kds-host does.
func withRuntime(rt *policy.Runtime) func(*controlplane.GlobalConfig) {
	return func(c *controlplane.GlobalConfig) {
		c.UsePlugins(rt)
		// Generous: on a loaded machine a decision must not fall back by accident.
		c.PolicyTimeout = time.Second
	}
}

func pluginStatus(rt *policy.Runtime, name string) policy.Status {
	for _, s := range rt.Status() {
		if s.Name == name {
			return s
		}
	}
	return policy.Status{}
}

func retryState(gl *controlplane.Global) controlplane.ZoneRetry {
	for _, v := range gl.ZoneViews() {
		if v.Retry != nil {
			return *v.Retry
		}
	}
	return controlplane.ZoneRetry{}
}

func document(text string) *policy.Document {
	return &policy.Document{Source: "test", Data: []byte(text)}
}

func TestAKilledPluginIsRestartedWhileZonesStayConnectedAndRoundsGoOn(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	// The plugin's rounds are 60ms apart, the built-in policy's 150ms: the delays say who decided.
	rt := startRuntime(t,
		policy.Spec{Path: testbin.Build(t, "./plugins/retry-forcer"), Document: document("policy: fixed\ndelay: 60ms\n")},
		policy.Spec{Path: policy.Builtin, Document: document("policy: fixed\ndelay: 150ms\n")},
	)
	gl := startGlobal(t, gst, reg, withRuntime(rt))
	z := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Hour}
	})

	// The zone NACKs Mesh again and again; the plugin decides every round.
	g.Eventually(func() uint32 { return retryState(gl.Global).Round }, patience).Should(BeNumerically(">=", 3))
	g.Expect(retryState(gl.Global).LastDelay).To(Equal("60ms"))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total")).To(BeZero())
	stream := gl.ZoneViews()[0].Stream

	// Kill the plugin while a round is pending.
	var pending controlplane.ZoneRetry
	g.Eventually(func() *time.Time { pending = retryState(gl.Global); return pending.NextRetry }, patience, time.Millisecond).ShouldNot(BeNil())
	old := pluginStatus(rt, "retry-forcer")
	g.Expect(syscall.Kill(old.PID, syscall.SIGKILL)).To(Succeed())

	// The pending round fires, and a decision after it is the built-in policy's.
	g.Eventually(func() uint32 { return retryState(gl.Global).Round }, patience, time.Millisecond).Should(BeNumerically(">", pending.Round))
	g.Eventually(func() float64 { return metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total") }, patience, 10*time.Millisecond).
		Should(BeNumerically(">=", 1))

	// The plugin comes back, a new process, and decides again.
	g.Eventually(func() string { return pluginStatus(rt, "retry-forcer").State }, patience, 5*time.Millisecond).
		Should(Equal(policy.StateRunning))
	now := pluginStatus(rt, "retry-forcer")
	g.Expect(now.PID).NotTo(Equal(old.PID))
	g.Expect(now.Restarts).To(Equal(1))
	fallbacks := metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total")
	round := retryState(gl.Global).Round
	g.Eventually(func() uint32 { return retryState(gl.Global).Round }, patience).Should(BeNumerically(">=", round+3))
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

// servePlugins runs a global that serves the plugin runtime's routes and its SIGHUP reloads
// (ServePlugins), as kds-host does, until the returned stop is called or the test ends.
func servePlugins(t *testing.T, st store.Store, rt *policy.Runtime, load func() (policy.Plugins, error), configFile string) (gl *controlplane.Global, stop func()) {
	t.Helper()
	cfg := controlplane.GlobalConfig{
		Store: st, Registry: resource.Default(), KDSAddr: "127.0.0.1:0", APIAddr: "127.0.0.1:0", DiagAddr: "127.0.0.1:0",
		Logger: logger(t, "global"),
	}
	cfg.UsePlugins(rt)
	gl, err := controlplane.NewGlobal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gl.ServePlugins(rt, load, configFile)
	return gl, runUntilStopped(t, "global", gl.Run)
}

// request sends an API request and returns the status and the body.
func request(t *testing.T, client *http.Client, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestThePluginRoutesAndSIGHUPReload runs the built-in plugins only (in-process, no binary):
// GET /api/plugins reports them, POST /api/plugins/reload and SIGHUP swap the policy document,
// a bad one is refused with the running plugins kept, and the SIGHUP loop ends with Run.
func TestThePluginRoutesAndSIGHUPReload(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := NewWithT(t)
	// SIGHUP would end the test process while no one listens; this listener keeps it alive.
	own := make(chan os.Signal, 8)
	signal.Notify(own, syscall.SIGHUP)
	defer signal.Stop(own)

	var mu sync.Mutex
	docText := "policy: fixed\ndelay: 150ms\n"
	setPolicy := func(p string) { mu.Lock(); defer mu.Unlock(); docText = p }
	load := func() (policy.Plugins, error) {
		mu.Lock()
		defer mu.Unlock()
		return policy.Plugins{List: []policy.Spec{{Path: policy.Builtin, Document: document(docText)}}}, nil
	}
	first, err := load()
	g.Expect(err).NotTo(HaveOccurred())
	rt, err := policy.New(policy.Config{Plugins: first, Options: controlplane.PluginOptions(logger(t, "global"))})
	g.Expect(err).NotTo(HaveOccurred())
	defer rt.Close()
	st, err := store.Open(t.Context(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	defer st.Close()
	gl, stop := servePlugins(t, st, rt, load, "/etc/kds-host.yaml")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + gl.APIAddr()

	// GET: the report, exactly these fields; no reload yet.
	code, body := request(t, client, http.MethodGet, base+"/api/plugins")
	g.Expect(code).To(Equal(http.StatusOK), body)
	var shape map[string]json.RawMessage
	g.Expect(json.Unmarshal([]byte(body), &shape)).To(Succeed())
	g.Expect(shape).To(HaveLen(3))
	g.Expect(shape).To(HaveKey("items"))
	g.Expect(shape).To(HaveKeyWithValue("total", json.RawMessage("1")))
	g.Expect(shape).To(HaveKeyWithValue("config", json.RawMessage(`"/etc/kds-host.yaml"`)))
	var report controlplane.PluginsReport
	g.Expect(json.Unmarshal([]byte(body), &report)).To(Succeed())
	g.Expect(report.Items).To(HaveLen(1))
	g.Expect(report.Items[0].Name).To(Equal(policy.Builtin))
	g.Expect(report.Items[0].Policy).To(Equal("fixed delay=150ms"))
	g.Expect(report.LastReload).To(BeNil())

	// POST: a new document is in force, and the answer is the report after the reload.
	setPolicy("policy: fixed\ndelay: 250ms\n")
	code, body = request(t, client, http.MethodPost, base+"/api/plugins/reload")
	g.Expect(code).To(Equal(http.StatusOK), body)
	report = controlplane.PluginsReport{}
	g.Expect(json.Unmarshal([]byte(body), &report)).To(Succeed())
	g.Expect(report.Items[0].Policy).To(Equal("fixed delay=250ms"))
	g.Expect(report.LastReload).NotTo(BeNil())
	g.Expect(report.LastReload.Error).To(BeEmpty())
	g.Expect(report.Config).To(Equal("/etc/kds-host.yaml"))

	// A bad document: 422, and the running plugins stay.
	setPolicy("policy: fixed\ndelay: -1s\n")
	code, body = request(t, client, http.MethodPost, base+"/api/plugins/reload")
	g.Expect(code).To(Equal(http.StatusUnprocessableEntity))
	g.Expect(body).To(ContainSubstring(`"title": "Plugin reload failed"`))
	g.Expect(body).To(ContainSubstring("(the running plugins stay)"))
	g.Expect(pluginStatus(rt, policy.Builtin).Policy).To(Equal("fixed delay=250ms"))
	g.Expect(rt.LastReload().Error).To(ContainSubstring("delay: must be > 0"))

	// SIGHUP: Run's loop reloads. Signals are sent until one is taken (the loop may not listen
	// yet); each is a reload of the same document, so more than one changes nothing.
	setPolicy("policy: fixed\ndelay: 300ms\n")
	g.Eventually(func() string {
		g.Expect(syscall.Kill(os.Getpid(), syscall.SIGHUP)).To(Succeed())
		return pluginStatus(rt, policy.Builtin).Policy
	}, patience, 10*time.Millisecond).Should(Equal("fixed delay=300ms"))
	g.Expect(rt.LastReload().Error).To(BeEmpty())

	// Once Run has returned, nobody reloads on SIGHUP: the loop has ended with it (goleak checks
	// that no goroutine is left, this that the signal goes only to the test's own listener).
	stop()
	setPolicy("policy: fixed\ndelay: 350ms\n")
	for len(own) > 0 {
		<-own
	}
	g.Expect(syscall.Kill(os.Getpid(), syscall.SIGHUP)).To(Succeed())
	g.Eventually(own, patience).Should(Receive())
	g.Expect(pluginStatus(rt, policy.Builtin).Policy).To(Equal("fixed delay=300ms"))
	client.CloseIdleConnections()
}

package controlplane_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// metric sums a Prometheus counter over its label sets, read from a /metrics endpoint.
func metric(t testing.TB, diagAddr, name string) float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + diagAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// metricHelp is the HELP text of the metric name on a diagnostics server's /metrics, or "".
func metricHelp(t testing.TB, diagAddr, name string) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + diagAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if help, ok := strings.CutPrefix(sc.Text(), "# HELP "+name+" "); ok {
			return help
		}
	}
	return ""
}

// TestAnOutageOfMeshConvergesAfterIt runs a real global and zone: the zone's admission refuses
// Mesh for a while, and the retry rounds bring everything once it is ready. The test asserts the
// order of what happens, not how long it takes: the timing of the rounds is the scheduler's,
// covered exactly by its synctest tests (engine/retry).
func TestAnOutageOfMeshConvergesAfterIt(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	for _, d := range resource.MeshDefaults("default") {
		put(t, gst, reg, d)
	}
	builtin := retrypolicy.New()
	cfg, err := retrypolicy.Parse([]byte("policy: exponential\nbase: 100ms\nfactor: 2\nmax: 30s\njitter: none\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(builtin.Apply(cfg)).To(Succeed())
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) { c.Builtin = builtin })
	const outage = 2 * time.Second
	zst := openSQLite(t)
	var mu sync.Mutex
	var stored []string // kinds, in the order the zone stored something of them
	before := time.Now()
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": outage}
		c.Applied = func(kind string, keys []resource.Key) {
			mu.Lock()
			defer mu.Unlock()
			if len(keys) > 0 {
				stored = append(stored, kind)
			}
		}
	})

	// The zone rejects Mesh, so its database refuses the 4 defaults of 3 kinds too.
	g.Eventually(func() int { return len(kindInsight(gl.Global, "zone-1", "MeshCircuitBreaker").Rejected) }, 10*time.Second).Should(Equal(1))
	g.Expect(kindInsight(gl.Global, "zone-1", "Mesh").Rejected).To(HaveLen(1))
	put(t, gst, reg, timeout("default", "applied-during-outage", "3s"))

	g.Eventually(count(zst, "MeshTimeout", "default"), 30*time.Second, 20*time.Millisecond).Should(Equal(3))
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(6))
	g.Expect(time.Since(before)).To(BeNumerically(">", outage), "nothing got past the outage")
	mu.Lock()
	g.Expect(stored).NotTo(BeEmpty())
	g.Expect(stored[0]).To(Equal("Mesh"), "the zone stores nothing before its Mesh")
	mu.Unlock()
	converged := z.Client.Stats().NACKs
	g.Expect(converged).To(BeNumerically(">=", 4))
	g.Consistently(func() int64 { return z.Client.Stats().NACKs }, 1500*time.Millisecond).Should(Equal(converged), "no NACK after convergence")
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_rounds_total")).To(BeNumerically(">=", 1))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_resent_resources_total")).To(BeNumerically(">=", 5))
	// The stream's retry state is reset.
	views := gl.ZoneViews()
	g.Expect(views).To(HaveLen(1))
	g.Expect(views[0].Retry).NotTo(BeNil())
	g.Expect(views[0].Retry.Failing).To(BeEmpty())
	g.Expect(views[0].Retry.Round).To(BeZero())
}

// stuckPolicy answers no decision until released, whatever its deadline says, and counts the
// calls that are stuck in it.
type stuckPolicy struct {
	release chan struct{}
	stuck   atomic.Int64
}

func (*stuckPolicy) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "stuck"}, nil
}

func (*stuckPolicy) Configure(context.Context, *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{}, nil
}

func (p *stuckPolicy) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	p.stuck.Add(1)
	defer p.stuck.Add(-1)
	<-p.release
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Millisecond)}, nil
}

// TestAStuckPolicyNeverDelaysAResponse: while every decision of the configured policy is stuck
// (the fallback decides past the deadline), each update of a healthy kind reaches the zone. The
// test asserts that order (updates arrive while a policy call is stuck), not a duration.
func TestAStuckPolicyNeverDelaysAResponse(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	put(t, gst, reg, timeout("default", "healthy", "1s"))
	put(t, gst, reg, resource.Resource{Kind: "MeshRetry", Mesh: "default", Name: "failing", Spec: []byte(`{"default":{"tcp":{"maxConnectAttempt":3}}}`)})
	stuck := &stuckPolicy{release: make(chan struct{})}
	defer close(stuck.release)
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) {
		c.RetryPolicy = func() shared.RetryForcer { return stuck }
	})
	zst := openSQLite(t)
	startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"MeshRetry": time.Hour}
	})
	g.Eventually(count(zst, "MeshTimeout", "default"), 10*time.Second).Should(Equal(1))
	// MeshRetry is NACKed again and again; every decision falls back past the deadline.
	g.Eventually(func() float64 { return metric(t, gl.DiagAddr(), "kds_retry_policy_fallbacks_total") }, 10*time.Second).Should(BeNumerically(">=", 2))

	// Meanwhile updates of the healthy kind flow as usual.
	for i := range 5 {
		spec := strconv.Itoa(i+2) + "s"
		put(t, gst, reg, timeout("default", "healthy", spec))
		g.Eventually(func() string {
			r, err := zst.Get(context.Background(), resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "healthy"})
			if err != nil {
				return ""
			}
			return string(r.Spec)
		}, 10*time.Second, 5*time.Millisecond).Should(ContainSubstring(`"` + spec + `"`))
		g.Expect(stuck.stuck.Load()).To(BeNumerically(">", 0), "update %d arrived while a policy call was stuck", i)
	}
}

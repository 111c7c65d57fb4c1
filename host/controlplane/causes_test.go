package controlplane_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

// policyOf is the built-in retry policy configured by doc.
func policyOf(t *testing.T, doc string) *retrypolicy.Forcer {
	t.Helper()
	cfg, err := retrypolicy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	f := retrypolicy.New()
	if err := f.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

// The zone asks again the moment its admission is ready, and for the policies the moment their
// Mesh is stored: with a retry timer of an hour, nothing else could bring them.
func TestTheZoneAsksAgainTheMomentTheCauseClears(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	for _, d := range resource.MeshDefaults("default") {
		put(t, gst, reg, d)
	}
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) {
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 1h\n")
	})
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Second}
	})
	g.Eventually(func() int { return len(kindInsight(gl.Global, "zone-1", "MeshTimeout").Rejected) }, 10*time.Second).Should(Equal(2))
	rejected := kindInsight(gl.Global, "zone-1", "MeshTimeout").Rejected
	g.Expect(rejected[0].Cause).To(Equal(event.CauseMissingOwner))
	g.Expect(rejected[0].MissingOwner).To(Equal("Mesh/default"))
	g.Expect(kindInsight(gl.Global, "zone-1", "Mesh").Rejected[0].Cause).To(Equal(event.CauseTransient))

	g.Eventually(count(zst, "", ""), 20*time.Second).Should(Equal(5))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_rounds_total")).To(BeZero(), "no timer round: the zone's re-requests did it")
	g.Expect(metric(t, gl.DiagAddr(), "kds_rerequests_total")).To(BeNumerically(">=", 1))
	g.Expect(z.Client.Stats().ReRequests).To(BeNumerically(">=", 1))
}

// A zone-side validation the global lets through: the same content is sent at most the policy's
// invalidAttempts times, then parked until it changes; the fixed version is sent at once.
func TestAnInvalidSpecIsParkedUntilItsContentChanges(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) {
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 20ms\ninvalidAttempts: 3\n")
	})
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionDeny = map[string]string{"deny": "true"}
	})
	g.Eventually(count(zst, "Mesh", ""), 10*time.Second).Should(Equal(1))
	bad := timeout("default", "bad", "3s")
	bad.Labels = map[string]string{"deny": "true"}
	put(t, gst, reg, bad)

	parked := func() []string {
		for _, v := range gl.ZoneViews() {
			if v.Retry == nil {
				continue
			}
			for _, f := range v.Retry.Failing {
				for _, h := range f.Parked {
					return []string{h.Name, h.Reason}
				}
			}
		}
		return nil
	}
	g.Eventually(parked, 10*time.Second).Should(HaveLen(2))
	g.Expect(parked()[0]).To(Equal("default/bad"))
	g.Expect(parked()[1]).To(ContainSubstring("invalid 3 times"))
	nacks := z.Client.Stats().NACKByKind["MeshTimeout"]
	g.Expect(nacks).To(Equal(int64(3)), "sent 3 times, then parked")
	g.Consistently(func() int64 { return z.Client.Stats().NACKByKind["MeshTimeout"] }, 500*time.Millisecond).Should(Equal(nacks))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_parked_resources_total")).To(Equal(1.0))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_held_resources_total")).To(Equal(1.0), "the deprecated name is still emitted")
	g.Expect(metricHelp(t, gl.DiagAddr(), "kds_retry_held_resources_total")).To(HavePrefix("Deprecated: use kds_retry_parked_resources_total"))

	fixed := timeout("default", "bad", "3s")
	put(t, gst, reg, fixed)
	g.Eventually(count(zst, "MeshTimeout", "default"), 10*time.Second).Should(Equal(1))
	g.Eventually(parked, 5*time.Second).Should(BeNil(), "the new content released it")
}

// A plain xDS client (Kuma's zone): NACKs with a message only, no causes, no re-requests. The
// global's timer alone brings it back.
func TestAPlainZoneConvergesWithTheTimer(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	for _, d := range resource.MeshDefaults("default") {
		put(t, gst, reg, d)
	}
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) {
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 200ms\n")
	})
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Second}
		c.Plain = true
	})
	g.Eventually(func() int { return len(kindInsight(gl.Global, "zone-1", "Mesh").Rejected) }, 10*time.Second).Should(Equal(1))
	g.Expect(kindInsight(gl.Global, "zone-1", "Mesh").Rejected[0].Cause).To(Equal(event.CauseUnspecified))
	g.Eventually(count(zst, "", ""), 20*time.Second).Should(Equal(5))
	g.Expect(metric(t, gl.DiagAddr(), "kds_retry_rounds_total")).To(BeNumerically(">=", 1), "the timer did it")
	g.Expect(metric(t, gl.DiagAddr(), "kds_rerequests_total")).To(BeZero())
	g.Expect(z.Client.Stats().ReRequests).To(BeZero())
}

// syncBuf is a log sink safe for concurrent writes.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The global logs at INFO what an operator needs: a zone connecting and leaving, the first NACK
// of a kind, and its recovery.
func TestTheGlobalLogsWhatAnOperatorNeeds(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	var out syncBuf
	gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "global", Level: hclog.Info, Output: &out})
		c.Builtin = policyOf(t, "policy: fixed\ndelay: 50ms\n")
	})
	z := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": 300 * time.Millisecond}
	})
	g.Eventually(count(z.Store, "Mesh", ""), 10*time.Second).Should(Equal(1))
	g.Eventually(out.String, 5*time.Second).Should(ContainSubstring("zone accepts the kind again: zone=zone-1 kind=Mesh"))
	log := out.String()
	g.Expect(log).To(ContainSubstring("zone connected: zone=zone-1"))
	g.Expect(strings.Count(log, "zone rejects a kind: zone=zone-1 kind=Mesh")).To(Equal(1), "the first NACK only:\n%s", log)
	z.stop()
	g.Eventually(out.String, 5*time.Second).Should(ContainSubstring("zone disconnected: zone=zone-1"))
}

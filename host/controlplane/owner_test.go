package controlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

func withHolds(c *controlplane.GlobalConfig) { c.OwnerHolds = true }

func seedMesh(t *testing.T, gst store.Store, reg *resource.Registry) {
	put(t, gst, reg, mesh("default"))
	for _, d := range resource.MeshDefaults("default") {
		put(t, gst, reg, d)
	}
}

func TestABurstOfMeshAndPoliciesArrivesWithoutANACK(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	gl := startGlobal(t, gst, reg, withHolds)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	g.Eventually(gl.Zones.Connected, 5*time.Second).Should(ConsistOf("zone-1"))

	// Policies first, then their Mesh: without holds the policies would be refused.
	failed, err := gst.Apply(context.Background(), []resource.Resource{
		withGen(timeout("default", "user-timeout", "2s")), withGen(mesh("default")),
	}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(failed).To(BeEmpty())
	g.Eventually(count(zst, "", ""), 5*time.Second).Should(Equal(2))
	g.Expect(z.Client.Stats().NACKs).To(BeZero())
}

func withGen(r resource.Resource) resource.Resource {
	r.Generation = 1
	if len(r.Spec) == 0 {
		r.Spec = []byte(`{}`)
	}
	return r
}

func TestDuringAMeshOutageOnlyMeshIsNACKedAndPoliciesAreWithheld(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	seedMesh(t, gst, reg)
	put(t, gst, reg, timeout("default", "user-timeout", "2s"))
	gl := startGlobal(t, gst, reg, withHolds)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": 2 * time.Second}
	})

	// While Mesh is refused, the 5 policies wait for it on the global.
	g.Eventually(func() int { return len(withheld(gl.Global)) }, 5*time.Second).Should(Equal(5))
	for _, h := range withheld(gl.Global) {
		g.Expect(h.Verdict).To(Equal("WAIT"))
		g.Expect(h.WaitingFor).To(Equal("Mesh/default"))
	}
	g.Expect(kindInsight(gl.Global, "zone-1", "MeshTimeout").Withheld).To(Equal(3))
	g.Expect(metric(t, gl.DiagAddr(), "kds_withheld_resources")).To(Equal(5.0))
	g.Expect(metric(t, gl.DiagAddr(), "kds_held_resources")).To(Equal(5.0), "the deprecated name is still emitted")
	g.Expect(metricHelp(t, gl.DiagAddr(), "kds_held_resources")).To(HavePrefix("Deprecated: use kds_withheld_resources"))

	// After the outage, Mesh is retried and ACKed, and the policies follow in the next push.
	// With the default jittered backoff the round after a 2 s outage fires within 6.3 s.
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(6), func() string { return dump(gl.Global, z) })
	g.Expect(z.Client.Stats().NACKByKind).To(Equal(map[string]int64{"Mesh": z.Client.Stats().NACKByKind["Mesh"]}))
	g.Expect(z.Client.Stats().NACKByKind["Mesh"]).To(BeNumerically(">=", 1))
	g.Expect(withheld(gl.Global)).To(BeEmpty())
}

// downOwnerCheck is an owner-check plugin that is not there.
type downOwnerCheck struct{}

func (downOwnerCheck) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return nil, errors.New("plugin exited")
}

func (downOwnerCheck) Predict(context.Context, *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	return nil, errors.New("plugin exited")
}

func TestWithTheOwnerCheckDownEverythingIsSentAndRetriesConverge(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	seedMesh(t, gst, reg)
	gl := startGlobal(t, gst, reg, withHolds, func(c *controlplane.GlobalConfig) {
		c.OwnerCheck = func() shared.OwnerCheck { return downOwnerCheck{} }
	})
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Second}
	})
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(5))
	g.Expect(metric(t, gl.DiagAddr(), "kds_owner_check_fail_open_total")).To(BeNumerically(">=", 1))
	g.Expect(z.Client.Stats().NACKByKind).To(HaveKey("MeshTimeout"), "unchecked, the policies were sent and refused, then retried")
}

func TestCheckPredictsAgainstAZonesInventory(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg, withHolds)
	zst := openSQLite(t)
	startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	g.Eventually(count(zst, "Mesh", ""), 5*time.Second).Should(Equal(1))
	g.Eventually(func() bool { return len(gl.Zones.Versions("zone-1")["Mesh"]) == 1 }, 5*time.Second).Should(BeTrue())

	ctx := context.Background()
	req := controlplane.CheckRequest{Resources: []resource.Resource{
		timeout("default", "a", "1s"), timeout("nowhere", "b", "1s"),
	}}
	req.Zone = "zone-1"
	res, err := gl.Check(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Items[0].Verdict).To(Equal("ACCEPT"))
	g.Expect(res.Items[1].Verdict).To(Equal("REJECT"))
	g.Expect(res.Rejected).To(Equal(1))

	req.Zone = "" // an empty zone: the Mesh exists on the global, so the policy waits for it
	res, err = gl.Check(ctx, req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Items[0].Verdict).To(Equal("WAIT"))
	g.Expect(res.Items[0].WaitingFor).To(Equal("Mesh/default"))
}

// withheld is what the global withholds from its first zone.
func withheld(g *controlplane.Global) []controlplane.Withheld {
	views := g.ZoneViews()
	if len(views) == 0 {
		return nil
	}
	return views[0].Withheld
}

// dump describes a global's and a zone's state, for a failure message.
func dump(g *controlplane.Global, z *runningZone) string {
	b, _ := json.MarshalIndent(map[string]any{"zones": g.ZoneViews(), "zone": z.Client.Stats()}, "", "  ")
	return string(b)
}

// Zones that connect to the same snapshot holding nothing are checked with one Predict between
// them, and again with one when their Mesh ACKs make them hold the same: the built-in owner check
// declares zone_independent. Each zone still gets everything.
func TestZonesThatHoldTheSameShareOnePredict(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	seedMesh(t, gst, reg)
	gl := startGlobal(t, gst, reg, withHolds)
	want := len(resource.MeshDefaults("default")) + 1
	zones := []string{"zone-1", "zone-2", "zone-3", "zone-4"}
	for _, name := range zones {
		zst := openSQLite(t)
		startZone(t, name, gl.KDSAddr(), zst, reg)
		g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(want), name)
	}
	g.Expect(metric(t, gl.DiagAddr(), "kds_owner_check_fail_open_total")).To(BeZero())
	g.Expect(metric(t, gl.DiagAddr(), "kds_owner_check_calls_total")).To(Equal(2.0),
		"one Predict for the zones that hold nothing, one for those that hold the Mesh")
}

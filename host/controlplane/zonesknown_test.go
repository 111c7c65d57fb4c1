package controlplane_test

import (
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/zone"
)

// A zone that lacks what the global serves shows in kds_zone_behind_resources by kind and
// reason for as long as it lacks it, well past the retry policy's give-up or park, and the
// series goes once the zone has caught up: a name parked as INVALID until its content is fixed,
// names given up on until the zone's admission is ready again.
func TestAZoneStaysBehindUntilItCatchesUp(t *testing.T) {
	for _, tc := range []struct {
		name, reason, policy string
		zone                 func(*zone.Config)
		bad                  func() resource.Resource
		fix                  func(t *testing.T, put func(resource.Resource))
	}{
		{
			name: "a name parked as invalid", reason: "parked", policy: "policy: fixed\ndelay: 20ms\ninvalidAttempts: 2\n",
			zone: func(c *zone.Config) { c.AdmissionDeny = map[string]string{"deny": "true"} },
			bad: func() resource.Resource {
				r := timeout("default", "bad", "3s")
				r.Labels = map[string]string{"deny": "true"}
				return r
			},
			fix: func(_ *testing.T, put func(resource.Resource)) { put(timeout("default", "bad", "3s")) },
		},
		{
			name: "names given up on", reason: "given_up", policy: "policy: fixed\ndelay: 20ms\nmaxAttempts: 2\n",
			zone: func(c *zone.Config) { c.AdmissionOutage = map[string]time.Duration{"MeshTimeout": 4 * time.Second} },
			bad:  func() resource.Resource { return timeout("default", "bad", "3s") },
			fix:  func(*testing.T, func(resource.Resource)) {}, // the outage ends
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			reg := resource.Default()
			gst := openSQLite(t)
			put(t, gst, reg, mesh("default"))
			gl := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) { c.Builtin = policyOf(t, tc.policy) })
			zst := openSQLite(t)
			startZone(t, "zone-1", gl.KDSAddr(), zst, reg, tc.zone)
			g.Eventually(count(zst, "Mesh", ""), 10*time.Second).Should(Equal(1))
			g.Eventually(sampleOf(t, gl.DiagAddr(), "kds_zone_behind_resources", `kind="Mesh",reason="missing",zone="zone-1"`), 10*time.Second).
				Should(Equal(-1.0), "a zone in sync (its ACK in) is behind in nothing")

			put(t, gst, reg, tc.bad())
			behind := sampleOf(t, gl.DiagAddr(), "kds_zone_behind_resources", `kind="MeshTimeout",reason="`+tc.reason+`",zone="zone-1"`)
			g.Eventually(behind, 10*time.Second).Should(Equal(1.0))
			g.Consistently(behind, time.Second, 100*time.Millisecond).Should(Equal(1.0), "it stays behind")
			g.Expect(sampleOf(t, gl.DiagAddr(), "kds_zone_behind_resources", `kind="Mesh",reason="missing",zone="zone-1"`)()).
				To(Equal(-1.0), "computed now, the Mesh the zone ACKed is not missing")

			tc.fix(t, func(r resource.Resource) { put(t, gst, reg, r) })
			g.Eventually(count(zst, "MeshTimeout", "default"), 10*time.Second).Should(Equal(1))
			g.Eventually(behind, 10*time.Second).Should(Equal(-1.0), "caught up: the series goes")
		})
	}
}

// A zone the global served stays visible after its grace: kds_zone_connected reads 0 and
// kds_zone_streams_total keeps counting across the gap, until DELETE /api/zones/{zone} forgets
// it. A connected zone cannot be forgotten, nor an unknown one.
func TestAZoneOnceServedStaysVisibleUntilForgotten(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gl := startGlobal(t, openSQLite(t), reg, func(c *controlplane.GlobalConfig) {
		c.ZoneGrace = 200 * time.Millisecond
		c.HeartbeatInterval = 50 * time.Millisecond
	})
	diag := gl.DiagAddr()
	connected := sampleOf(t, diag, "kds_zone_connected", `zone="zone-1"`)
	streams := sampleOf(t, diag, "kds_zone_streams_total", `zone="zone-1"`)

	z := startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg)
	g.Eventually(connected, 10*time.Second).Should(Equal(1.0))
	code, body := call(t, gl, http.MethodDelete, "/api/zones/zone-1", "")
	g.Expect(code).To(Equal(http.StatusConflict), body)
	g.Expect(body).To(ContainSubstring("stop it first"))
	time.Sleep(300 * time.Millisecond) // a heartbeat records the zone's stream, and the zone as known

	z.stop()
	g.Eventually(func() bool { _, ok := gl.Zones.Insight("zone-1"); return ok }, 10*time.Second).Should(BeFalse(), "past its grace")
	g.Eventually(connected, 5*time.Second).Should(Equal(0.0), "a known zone is still shown, disconnected")
	g.Consistently(connected, time.Second, 100*time.Millisecond).Should(Equal(0.0))
	g.Expect(streams()).To(Equal(1.0))

	z = startZone(t, "zone-1", gl.KDSAddr(), openSQLite(t), reg)
	g.Eventually(connected, 10*time.Second).Should(Equal(1.0))
	g.Expect(streams()).To(Equal(2.0), "the count goes on past the grace")
	z.stop()
	g.Eventually(func() bool { _, ok := gl.Zones.Insight("zone-1"); return ok }, 10*time.Second).Should(BeFalse())

	code, body = call(t, gl, http.MethodDelete, "/api/zones/zone-1", "")
	g.Expect(code).To(Equal(http.StatusOK), body)
	g.Expect(connected()).To(Equal(-1.0), "forgotten: no series")
	g.Expect(streams()).To(Equal(-1.0))
	code, body = call(t, gl, http.MethodDelete, "/api/zones/zone-1", "")
	g.Expect(code).To(Equal(http.StatusNotFound), body)
	g.Expect(body).To(ContainSubstring(`zone \"zone-1\" is not known`))
}

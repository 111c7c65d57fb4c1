package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/internal/testbin"
)

// apiClient talks to a test global's API as its admin.
func apiClient(t testing.TB, addr string) *api.Client {
	return &api.Client{BaseURL: "http://" + addr, HTTPClient: &http.Client{Timeout: 10 * time.Second}, Token: adminToken(t)}
}

func TestMeshAndPoliciesReachTheZoneAndDeletesFollow(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gl := startGlobal(t, openSQLite(t), reg)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	ctx := context.Background()
	global := apiClient(t, gl.APIAddr())

	meshKind, _ := reg.Get("Mesh")
	mtKind, _ := reg.Get("MeshTimeout")
	_, outcome, err := global.Put(ctx, meshKind, "", "default", []byte("type: Mesh\nname: default\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(outcome).To(Equal(api.Created))
	// The Mesh and its 4 default policies.
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(5))

	_, _, err = global.Put(ctx, mtKind, "default", "timeout-for-backend", []byte(`
type: MeshTimeout
mesh: default
name: timeout-for-backend
spec:
  targetRef: {kind: Mesh}
  default: {connectionTimeout: 2s}
`))
	g.Expect(err).NotTo(HaveOccurred())

	// What a user runs: the real CLI against the zone's API.
	cli := testbin.Build(t, "./host/cmd/kds-host")
	total := func() int {
		out, err := exec.Command(cli, "get", "meshtimeouts", "-m", "default", "-o", "json", "--cp", "http://"+z.APIAddr()).Output()
		if err != nil {
			return -1
		}
		var list struct{ Total int }
		if json.Unmarshal(out, &list) != nil {
			return -2
		}
		return list.Total
	}
	g.Eventually(total, 10*time.Second).Should(Equal(3))

	g.Expect(global.Delete(ctx, mtKind, "default", "timeout-for-backend")).To(Succeed())
	g.Eventually(total, 10*time.Second).Should(Equal(2))

	// Every response was ACKed: nothing was rejected on the way.
	g.Expect(z.Client.Stats().NACKs).To(BeZero())
}

func TestADatabaseThatRefusesAPolicyWithoutItsMeshIsNACKedByName(t *testing.T) {
	for _, db := range []struct {
		name string
		open func(testing.TB) storeOpener
	}{{"sqlite", sqliteOpener}, {"postgres", postgresOpener}} {
		t.Run(db.name, func(t *testing.T) {
			g := NewWithT(t)
			reg := resource.Default()
			gst := openSQLite(t)
			put(t, gst, reg, mesh("present"))
			put(t, gst, reg, mesh("absent"))
			gl := startGlobal(t, gst, reg)
			zst := db.open(t)()
			// The zone's admission refuses Mesh writes, so Mesh "absent" never lands... and
			// neither does "present": store "present" on the zone first, as if synced earlier.
			put(t, zst, reg, mesh("present"))
			put(t, gst, reg, timeout("present", "ok", "1s"))
			put(t, gst, reg, timeout("absent", "orphan", "1s"))
			z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
				c.AdmissionOutage = map[string]time.Duration{"Mesh": time.Hour}
			})

			// The valid policy of the same response is stored; the orphan is refused by the
			// database's foreign key and named in the NACK's structured list.
			g.Eventually(count(zst, "MeshTimeout", "present"), 10*time.Second).Should(Equal(1))
			g.Expect(count(zst, "MeshTimeout", "absent")()).To(BeZero())
			var rejected []event.Rejection
			g.Eventually(func() []event.Rejection {
				rejected = kindInsight(gl.Global, "zone-1", "MeshTimeout").Rejected
				return rejected
			}, 10*time.Second).Should(HaveLen(1))
			g.Expect(rejected[0].Name).To(Equal("absent/orphan"))
			g.Expect(rejected[0].MissingOwner).To(Equal("Mesh/absent"))
			g.Expect(rejected[0].Reason).To(ContainSubstring("foreign key"))
			g.Expect(z.Client.Stats().NACKByKind).To(HaveKey("MeshTimeout"))
		})
	}
}

type storeOpener func() store.Store

func sqliteOpener(t testing.TB) storeOpener {
	return func() store.Store { return openSQLite(t) }
}

func postgresOpener(t testing.TB) storeOpener {
	return func() store.Store { return openPostgres(t) }
}

func kindInsight(g *controlplane.Global, zoneName, kind string) controlplane.KindView {
	for _, z := range g.ZoneViews() {
		if z.Zone != zoneName {
			continue
		}
		for _, k := range z.Kinds {
			if k.Kind == kind {
				return *k
			}
		}
	}
	return controlplane.KindView{}
}

func TestThirtyTwoKindsOfAHundredResourcesSyncOnOneStream(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	var extra []string
	for i := range 32 {
		k := fmt.Sprintf("TestPolicy%02d", i)
		extra = append(extra, k)
		g.Expect(reg.Register(resource.Kind{Name: k, Plural: strings.ToLower(k) + "s", Scope: resource.ScopeMesh})).To(Succeed())
	}
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	ctx := context.Background()
	var batch []resource.Resource
	for _, k := range extra {
		for i := range 100 {
			batch = append(batch, resource.Resource{Kind: k, Mesh: "default", Name: fmt.Sprintf("p-%03d", i), Spec: json.RawMessage(`{"n":1}`), Generation: 1})
		}
	}
	failed, err := gst.Apply(ctx, batch, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(failed).To(BeEmpty())

	gl := startGlobal(t, gst, reg)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	g.Eventually(count(zst, "", ""), 60*time.Second, 100*time.Millisecond).Should(Equal(32*100 + 1))
	g.Expect(z.Client.Stats().NACKs).To(BeZero())
	insights := gl.Zones.Insights()
	g.Expect(insights).To(HaveLen(1))
	g.Expect(insights[0].Types).To(HaveLen(33), "every kind went over the one stream")
}

func TestAGlobalRestartResendsOnlyWhatChanged(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	for i := range 20 {
		put(t, gst, reg, timeout("default", fmt.Sprintf("t-%02d", i), "1s"))
	}
	gl := startGlobal(t, gst, reg)
	kdsAddr := gl.KDSAddr()
	zst := openSQLite(t)
	startZone(t, "zone-1", kdsAddr, zst, reg)
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(21))
	gl.stop()

	// While the global is down: one policy changes, one is added, one is deleted.
	put(t, gst, reg, timeout("default", "t-00", "9s"))
	put(t, gst, reg, timeout("default", "t-new", "1s"))
	g.Expect(gst.Delete(context.Background(), resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "t-19"})).To(Succeed())

	gl2 := startGlobal(t, gst, reg, func(c *controlplane.GlobalConfig) { c.KDSAddr = kdsAddr })
	g.Eventually(func() string {
		r, err := zst.Get(context.Background(), resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "t-00"})
		if err != nil {
			return ""
		}
		return string(r.Spec)
	}, 15*time.Second).Should(ContainSubstring("9s"))
	g.Eventually(count(zst, "MeshTimeout", "default"), 10*time.Second).Should(Equal(20))

	// The zone reconnected with initial_resource_versions: the new global sent the changed and
	// the added policy and one removal, nothing else.
	mt := kindInsight(gl2.Global, "zone-1", "MeshTimeout")
	g.Expect(mt.Sent).To(Equal(int64(3)))
	g.Expect(kindInsight(gl2.Global, "zone-1", "Mesh").Sent).To(BeZero())
}

func TestAWriteThroughOneReplicaReachesAZoneOfAnother(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	ctx := context.Background()
	dsn := pg.Database(t)
	st1, st2 := openPostgresAt(t, dsn), openPostgresAt(t, dsn)
	put(t, st1, reg, mesh("default"))
	put(t, st1, reg, timeout("default", "old", "1s"))
	gl1 := startGlobal(t, st1, reg)
	gl2 := startGlobal(t, st2, reg)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl2.KDSAddr(), zst, reg)
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(2))

	// Writes through the first replica's API: the second replica notices them by polling the
	// revision (nothing signals its Store), and sends its zone what changed.
	global1 := apiClient(t, gl1.APIAddr())
	meshKind, _ := reg.Get("Mesh")
	mtKind, _ := reg.Get("MeshTimeout")
	_, _, err := global1.Put(ctx, meshKind, "", "other", []byte("type: Mesh\nname: other\n"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(count(zst, "", "other"), 10*time.Second).Should(Equal(4), "Mesh other's default policies")
	_, _, err = global1.Put(ctx, mtKind, "default", "old", []byte(`
type: MeshTimeout
mesh: default
name: old
spec:
  targetRef: {kind: Mesh}
  default: {connectionTimeout: 7s}
`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() string {
		r, err := zst.Get(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "old"})
		if err != nil {
			return ""
		}
		return string(r.Spec)
	}, 10*time.Second).Should(ContainSubstring("7s"))

	// A Mesh deleted through the first replica takes its policies on the zone too (the
	// cascaded deletes are changes like any other).
	g.Expect(global1.Delete(ctx, meshKind, "", "other")).To(Succeed())
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(2))
	g.Expect(count(zst, "", "other")()).To(BeZero())
	g.Expect(z.Client.Stats().NACKs).To(BeZero())
	g.Expect(gl2.Cache.Snapshot().Len()).To(Equal(2))
}

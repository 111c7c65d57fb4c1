package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
)

// replicaOf returns where the global's zone views say the zone is connected.
func replicaOf(gl *controlplane.Global, zoneName string) func() string {
	return func() string {
		for _, v := range gl.ZoneViews() {
			if v.Zone == zoneName {
				return v.Replica
			}
		}
		return ""
	}
}

// specOf returns the spec the store holds for a MeshTimeout in mesh default, or "".
func specOf(st store.Store, name string) func() string {
	return func() string {
		r, err := st.Get(context.Background(), resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: name})
		if err != nil {
			return ""
		}
		return string(r.Spec)
	}
}

// TestReplicasShareOnePostgreSQL runs two replicas on one PostgreSQL database, neither polling
// (their poll interval is an hour), and a zone that lists both, connected to B:
//   - a write through A reaches the zone on B, so it came by NOTIFY;
//   - with every LISTEN connection killed (pg_terminate_backend), writes still reach it (the
//     store polls), and again by NOTIFY once B's store listens again;
//   - /api/zones on A says the zone is on B;
//   - B stops and the zone moves to A, which sends it what changed meanwhile and nothing else.
func TestReplicasShareOnePostgreSQL(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	reg := resource.Default()
	dsn := pg.Database(t)
	stA, stB := openPostgresAt(t, dsn), openPostgresAt(t, dsn)
	put(t, stA, reg, mesh("default"))
	for i := range 10 {
		put(t, stA, reg, timeout("default", fmt.Sprintf("t-%02d", i), "1s"))
	}
	replica := func(id string) func(*controlplane.GlobalConfig) {
		return func(c *controlplane.GlobalConfig) {
			c.ReplicaID, c.PollInterval, c.HeartbeatInterval = id, time.Hour, 50*time.Millisecond
		}
	}
	glA := startGlobal(t, stA, reg, replica("A"))
	glB := startGlobal(t, stB, reg, replica("B"))
	for _, gl := range []*runningGlobal{glA, glB} { // B first in the zone's list must be serving
		g.Eventually(func() int { return httpStatus(gl.DiagAddr() + "/readyz") }, 30*time.Second).Should(Equal(http.StatusOK))
	}
	zst := openSQLite(t)
	z := startZone(t, "zone-1", glB.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.GlobalAddress = "grpc://" + glB.KDSAddr() + ", grpc://" + glA.KDSAddr()
	})
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(11))
	g.Expect(z.Client.Stats().Global).To(Equal("grpc://" + glB.KDSAddr()))

	// A write through A reaches the zone on B: B heard it by LISTEN.
	put(t, stA, reg, timeout("default", "t-00", "2s"))
	g.Eventually(specOf(zst, "t-00"), 10*time.Second).Should(ContainSubstring("2s"))
	notifiedB := func() int64 { return stB.(store.Listener).ListenStatus().Notified }
	g.Eventually(notifiedB, 10*time.Second).Should(BeNumerically(">=", 1))
	// And what it changed came in the notification: B did not query for it.
	g.Eventually(func() int64 { return stB.(store.Listener).ListenStatus().ChangesFromLog }, 10*time.Second).Should(BeNumerically(">=", 1))

	// Every replica's LISTEN connection killed: the write still arrives, by polling.
	var killed int
	g.Expect(openSQLConn(t, dsn).QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, store.ListenApplicationName).Scan(&killed)).To(Succeed())
	g.Expect(killed).To(Equal(2))
	put(t, stA, reg, timeout("default", "t-01", "2s"))
	g.Eventually(specOf(zst, "t-01"), 10*time.Second).Should(ContainSubstring("2s"))
	// And by LISTEN again once B's store is back on it.
	g.Eventually(func() int64 { return stB.(store.Listener).ListenStatus().Connects }, 10*time.Second).Should(Equal(int64(2)))
	g.Eventually(func() bool { return stB.(store.Listener).ListenStatus().Listening }, 10*time.Second).Should(BeTrue())
	notified := notifiedB()
	put(t, stA, reg, timeout("default", "t-02", "2s"))
	g.Eventually(specOf(zst, "t-02"), 10*time.Second).Should(ContainSubstring("2s"))
	g.Eventually(notifiedB, 10*time.Second).Should(BeNumerically(">", notified))

	// Either replica tells where the zone is.
	g.Eventually(replicaOf(glA.Global, "zone-1"), 10*time.Second).Should(Equal("B"))
	g.Expect(replicaOf(glB.Global, "zone-1")()).To(Equal("B"))
	var served struct {
		Items []controlplane.ZoneView `json:"items"`
	}
	g.Expect(apiClient(t, glA.APIAddr()).GetJSON(ctx, "/api/zones", &served)).To(Succeed())
	g.Expect(served.Items).To(ContainElement(And(HaveField("Zone", "zone-1"), HaveField("Replica", "B"),
		HaveField("ReplicaAddress", "grpc://"+glB.KDSAddr()), HaveField("Connected", true))))

	// B goes; meanwhile one policy changes, one is added, one is deleted. The zone moves to A,
	// which sends those three and nothing it holds already.
	glB.stop()
	put(t, stA, reg, timeout("default", "t-03", "9s"))
	put(t, stA, reg, timeout("default", "t-new", "1s"))
	g.Expect(stA.Delete(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "t-09"})).To(Succeed())
	g.Eventually(specOf(zst, "t-03"), 10*time.Second).Should(ContainSubstring("9s"))
	g.Eventually(count(zst, "MeshTimeout", "default"), 10*time.Second).Should(Equal(10))
	g.Expect(z.Client.Stats().Global).To(Equal("grpc://" + glA.KDSAddr()))
	sentByA := func() int64 { return kindInsight(glA.Global, "zone-1", "MeshTimeout").Sent }
	g.Eventually(sentByA, 10*time.Second).Should(Equal(int64(3)), "the change, the new one, the removal")
	g.Consistently(sentByA, 300*time.Millisecond).Should(Equal(int64(3)), "and nothing else")
	g.Expect(kindInsight(glA.Global, "zone-1", "Mesh").Sent).To(BeZero())
	g.Expect(replicaOf(glA.Global, "zone-1")()).To(Equal("A"))
	g.Expect(z.Client.Stats().NACKs).To(BeZero())
}

// httpStatus is the HTTP status of GET http://url, or 0.
func httpStatus(url string) int {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// openSQLConn opens a plain connection to the database, closed when the test ends.
func openSQLConn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestAZoneSkipsAReplicaThatIsDown: the first address answers nothing; the zone syncs from the
// next one.
func TestAZoneSkipsAReplicaThatIsDown(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := openSQLite(t)
	put(t, gst, reg, mesh("default"))
	gl := startGlobal(t, gst, reg)
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg, func(c *zone.Config) {
		c.GlobalAddress = "grpc://127.0.0.1:1"
		c.GlobalAddresses = []string{"grpc://" + gl.KDSAddr()}
	})
	g.Eventually(count(zst, "", ""), 10*time.Second).Should(Equal(1))
	g.Expect(z.Client.Stats().Global).To(Equal("grpc://" + gl.KDSAddr()))
	g.Expect(z.Client.Stats().Sessions).To(Equal(1))
}

package controlplane_test

import (
	"bufio"
	"context"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// sample reads one series from a diagnostics server's /metrics: name with exactly the labels
// given as Prometheus prints them (`zone="zone-1"`, sorted; "" for none), and whether it is there.
func sample(t testing.TB, diagAddr, name, labels string) (float64, bool) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + diagAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	want := name + " "
	if labels != "" {
		want = name + "{" + labels + "} "
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err != nil {
				t.Fatalf("%s%s: %v", name, labels, err)
			}
			return f, true
		}
	}
	return 0, false
}

// sampleOf is sample for Eventually: -1 while the series is not there.
func sampleOf(t testing.TB, diagAddr, name, labels string) func() float64 {
	return func() float64 {
		v, ok := sample(t, diagAddr, name, labels)
		if !ok {
			return -1
		}
		return v
	}
}

// The series the alerting rules (deploy/prometheus) read of a zone's connection and of the
// store, on a real global and zone: kds_zone_connected and kds_zone_streams_total on the global,
// kds_zone_client_* on the zone, kds_store_up on both, the update and apply histograms, and the
// refusal reasons at 0 before any refusal.
func TestConnectionAndStoreMetricsFollowTheZoneAndTheStore(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	gst := &downStore{Store: openSQLite(t)}
	gl := startGlobal(t, gst, reg)
	g.Eventually(func() int { return httpStatus(gl.DiagAddr() + "/readyz") }, 30*time.Second).Should(Equal(http.StatusOK))
	zst := openSQLite(t)
	z := startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	const zone1 = `zone="zone-1"`

	global, zoneDiag := gl.DiagAddr(), z.DiagAddr()
	g.Eventually(sampleOf(t, global, "kds_zone_connected", zone1), 10*time.Second).Should(Equal(1.0))
	g.Expect(sampleOf(t, global, "kds_zone_streams_total", zone1)()).To(Equal(1.0))
	g.Eventually(sampleOf(t, zoneDiag, "kds_zone_client_connected", zone1), 10*time.Second).Should(Equal(1.0))
	g.Expect(sampleOf(t, zoneDiag, "kds_zone_client_streams_total", zone1)()).To(Equal(1.0))
	g.Expect(sampleOf(t, zoneDiag, "kds_zone_client_blocked", zone1)()).To(Equal(0.0))
	for _, addr := range []string{global, zoneDiag} {
		g.Eventually(sampleOf(t, addr, "kds_store_up", ""), 10*time.Second).Should(Equal(1.0), addr)
		g.Expect(sampleOf(t, addr, "kds_build_info", `go_version="`+runtime.Version()+`",revision="unknown",version="dev"`)()).To(Equal(1.0), addr)
		_, listens := sample(t, addr, "kds_store_listen_up", "")
		g.Expect(listens).To(BeFalse(), "SQLite has no LISTEN connection")
		_, counted := sample(t, addr, "kds_store_changes_total", `source="query"`)
		g.Expect(counted).To(BeFalse(), "nor a log of what notifications carried")
	}
	for _, reason := range []string{"unauthenticated", "permission_denied", "limit", "invalid", "replaced", "other"} {
		v, ok := sample(t, global, "kds_stream_refusals_total", `reason="`+reason+`"`)
		g.Expect(ok).To(BeTrue(), "%s is exported before the first refusal", reason)
		g.Expect(v).To(BeZero(), reason)
	}

	// A write: the global updates its snapshot, the zone applies it.
	updates := sampleOf(t, global, "kds_snapshot_update_seconds_count", "")()
	g.Expect(updates).To(BeNumerically(">=", 1), "the first snapshot")
	put(t, gst, reg, mesh("default"))
	g.Eventually(count(zst, "Mesh", ""), 10*time.Second).Should(Equal(1))
	g.Eventually(sampleOf(t, global, "kds_snapshot_update_seconds_count", ""), 10*time.Second).Should(BeNumerically(">", updates))
	g.Eventually(sampleOf(t, zoneDiag, "kds_zone_client_apply_seconds_count", zone1), 10*time.Second).Should(BeNumerically(">=", 1))
	g.Expect(sampleOf(t, zoneDiag, "kds_zone_client_responses_total", zone1)()).To(BeNumerically(">=", 1))
	g.Expect(sampleOf(t, zoneDiag, "kds_zone_client_acks_total", zone1)()).To(BeNumerically(">=", 1))
	// The global's per-kind series are its sessions' counters: the Mesh went out in a response
	// and was ACKed.
	const meshOfZone1 = `kind="Mesh",zone="zone-1"`
	g.Eventually(sampleOf(t, global, "kds_acks_total", meshOfZone1), 10*time.Second).Should(BeNumerically(">=", 1))
	g.Expect(sampleOf(t, global, "kds_responses_total", meshOfZone1)()).To(BeNumerically(">=", 1))
	g.Expect(sampleOf(t, global, "kds_resources_sent_total", meshOfZone1)()).To(BeNumerically(">=", 1))
	g.Expect(sampleOf(t, global, "kds_nacks_total", meshOfZone1)()).To(Equal(0.0))
	acks := sampleOf(t, global, "kds_acks_total", meshOfZone1)()

	// The global's store stops answering, and answers again.
	gst.down.Store(true)
	g.Eventually(sampleOf(t, global, "kds_store_up", ""), 10*time.Second).Should(Equal(0.0))
	gst.down.Store(false)
	g.Eventually(sampleOf(t, global, "kds_store_up", ""), 10*time.Second).Should(Equal(1.0))

	// The zone goes (the global keeps it, disconnected, for its grace) and comes back: its
	// second stream is counted.
	z.stop()
	g.Eventually(sampleOf(t, global, "kds_zone_connected", zone1), 10*time.Second).Should(Equal(0.0))
	z = startZone(t, "zone-1", gl.KDSAddr(), zst, reg)
	g.Eventually(sampleOf(t, global, "kds_zone_connected", zone1), 10*time.Second).Should(Equal(1.0))
	g.Expect(sampleOf(t, global, "kds_zone_streams_total", zone1)()).To(Equal(2.0))
	// A counter never goes back: the first stream's ACKs stay counted on the second's.
	g.Expect(sampleOf(t, global, "kds_acks_total", meshOfZone1)()).To(BeNumerically(">=", acks))

	// The global goes: the zone says it is not connected.
	g.Eventually(sampleOf(t, z.DiagAddr(), "kds_zone_client_connected", zone1), 10*time.Second).Should(Equal(1.0))
	gl.stop()
	g.Eventually(sampleOf(t, z.DiagAddr(), "kds_zone_client_connected", zone1), 10*time.Second).Should(Equal(0.0))
}

// kds_store_listen_up and kds_store_listen_connects_total follow a PostgreSQL store's LISTEN
// connection: killed, it is made again and counted.
func TestListenMetricsFollowThePostgreSQLListenConnection(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	dsn := pg.Database(t)
	st, err := store.Open(ctx, dsn, "")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { st.Close() })
	gl := startGlobal(t, st, resource.Default())
	diag := gl.DiagAddr()
	g.Eventually(sampleOf(t, diag, "kds_store_listen_up", ""), 10*time.Second).Should(Equal(1.0))
	g.Expect(sampleOf(t, diag, "kds_store_listen_connects_total", "")()).To(Equal(1.0))
	g.Eventually(sampleOf(t, diag, "kds_store_up", ""), 10*time.Second).Should(Equal(1.0))

	var killed int
	g.Expect(openSQLConn(t, dsn).QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, store.ListenApplicationName).Scan(&killed)).To(Succeed())
	g.Expect(killed).To(Equal(1))
	g.Eventually(sampleOf(t, diag, "kds_store_listen_connects_total", ""), 10*time.Second).Should(Equal(2.0))
	g.Eventually(sampleOf(t, diag, "kds_store_listen_up", ""), 10*time.Second).Should(Equal(1.0))

	// kds_store_changes_total says how the snapshot's updates learnt what changed: both sources
	// from the start, and a write through the store from its log, no query.
	for _, source := range []string{"log", "query"} {
		_, ok := sample(t, diag, "kds_store_changes_total", `source="`+source+`"`)
		g.Expect(ok).To(BeTrue(), "%s is exported before the first", source)
	}
	fromLog := sampleOf(t, diag, "kds_store_changes_total", `source="log"`)
	before := fromLog()
	put(t, st, resource.Default(), mesh("default"))
	g.Eventually(fromLog, 10*time.Second).Should(BeNumerically(">", before))
}

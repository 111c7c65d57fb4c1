package controlplane_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/store/pgtest"
)

// While its PostgreSQL hangs (every server process stopped, connections open), a global's
// /metrics and /readyz answer at once from the store probe's last answer: kds_store_up goes to 0
// once the probe is past its deadline and /readyz says the store does not answer; when the
// database comes back, both recover by themselves. (Before: the scrape ran the probe and took
// its whole 2 s deadline, so a 2 s scrape timeout lost every series of the global.)
func TestScrapesAnswerAtOnceWhilePostgreSQLHangs(t *testing.T) {
	if pgtest.Skipped() {
		t.Skipf("%s=1: skipping PostgreSQL test", pgtest.EnvSkip)
	}
	if os.Getenv(pgtest.EnvDSN) != "" {
		t.Skip("an external PostgreSQL server cannot be frozen")
	}
	g := NewWithT(t)
	srv, err := pgtest.StartServer(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(srv.Stop()).To(Succeed()) })
	st, err := store.Open(context.Background(), srv.Database(t), "")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { st.Close() })
	gl := startGlobal(t, st, resource.Default(), func(c *controlplane.GlobalConfig) { c.ProbeInterval = 100 * time.Millisecond })
	t.Cleanup(func() { _ = srv.Thaw() }) // before the global stops (cleanups run last first)
	diag := gl.DiagAddr()
	client := &http.Client{Timeout: 5 * time.Second}
	// get fetches a diagnostics path and says how long it took.
	get := func(path string) (int, string, time.Duration) {
		began := time.Now()
		resp, err := client.Get("http://" + diag + path)
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		g.Expect(err).NotTo(HaveOccurred())
		return resp.StatusCode, string(b), time.Since(began)
	}
	g.Eventually(func() int { code, _, _ := get("/readyz"); return code }, 30*time.Second).Should(Equal(http.StatusOK))
	g.Expect(sampleOf(t, diag, "kds_store_up", "")()).To(Equal(1.0))

	g.Expect(srv.Freeze()).To(Succeed())
	frozen := time.Now()
	var slowest time.Duration
	for time.Since(frozen) < 4*time.Second {
		code, body, took := get("/metrics")
		g.Expect(code).To(Equal(http.StatusOK))
		g.Expect(body).To(ContainSubstring("kds_store_up "))
		slowest = max(slowest, took)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the slowest of the scrapes in the 4 s after PostgreSQL froze took %s", slowest)
	// Far under a 2 s scrape timeout, on a shared machine under -race.
	g.Expect(slowest).To(BeNumerically("<", time.Second), "a scrape waited on the hung store")
	g.Expect(sampleOf(t, diag, "kds_store_up", "")()).To(Equal(0.0), "the probe is past its 2 s deadline")
	code, body, took := get("/readyz")
	g.Expect(code).To(Equal(http.StatusServiceUnavailable))
	g.Expect(body).To(ContainSubstring("the store does not answer"))
	g.Expect(took).To(BeNumerically("<", time.Second))

	g.Expect(srv.Thaw()).To(Succeed())
	g.Eventually(sampleOf(t, diag, "kds_store_up", ""), 30*time.Second, 100*time.Millisecond).Should(Equal(1.0))
	g.Eventually(func() int { code, _, _ := get("/readyz"); return code }, 10*time.Second).Should(Equal(http.StatusOK))
}

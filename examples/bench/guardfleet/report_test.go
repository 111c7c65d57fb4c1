package main

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

// The medians are each figure's over the runs, the ratios a server's medians over stock's over
// the same cache and scenario, and stock's own row and a cache without stock have none.
func TestTheTableIsMediansAndRatiosToStockOfTheSameCache(t *testing.T) {
	o := options{scenarios: []scenario{{Streams: 1000}}, caches: []string{cacheSnapshot, cacheLinear}, runs: 3, clusters: 100, updates: 10}
	r := newReport(o)
	sc := o.scenarios[0]
	for _, rate := range []float64{100, 300, 200} {
		r.add(job{sc, cacheSnapshot, stock}, figures{Rate: rate * 1000, SyncCPU: 2, LastP50: 10, UpdateCPU: 0.5, PeakRSS: 100})
	}
	for _, rate := range []float64{50, 40, 60} {
		r.add(job{sc, cacheSnapshot, guardOn}, figures{Rate: rate * 1000, SyncCPU: 3, LastP50: 70, UpdateCPU: 1, PeakRSS: 400})
	}
	r.add(job{sc, cacheLinear, guardOn}, figures{Rate: 10})
	r.finish()

	if len(r.Results) != 3 {
		t.Fatalf("%d results, want the 3 that ran", len(r.Results))
	}
	byJob := func(c, sv string) *result { return r.byJob[job{sc, c, sv}] }
	st, on := byJob(cacheSnapshot, stock), byJob(cacheSnapshot, guardOn)
	if st.Median.Rate != 200e3 || on.Median.Rate != 50e3 {
		t.Errorf("median rates %v and %v, want 200 and 50", st.Median.Rate, on.Median.Rate)
	}
	want := ratios{Rate: 0.25, SyncCPU: 1.5, PeakRSS: 4, LastP50: 7, UpdateCPU: 2}
	if on.VsStock != want {
		t.Errorf("guard-on over stock: %+v, want %+v", on.VsStock, want)
	}
	if st.VsStock.Rate != 1 {
		t.Errorf("stock over itself: %v, want 1", st.VsStock.Rate)
	}
	if l := byJob(cacheLinear, guardOn); l.stock != nil || l.VsStock != (ratios{}) {
		t.Errorf("a cache whose stock did not run has ratios: %+v", l.VsStock)
	}
	if got := on.Median.cpuPerUpdateStream(1000); math.Abs(got-1000) > 1e-9 {
		t.Errorf("CPU per update per stream %v us, want 1000 (1 s over 1,000 streams)", got)
	}
	var b strings.Builder
	r.print(&b)
	if !strings.Contains(b.String(), "50 k/s (0.25)") || !strings.Contains(b.String(), "medians of 3 interleaved runs") {
		t.Errorf("the table:\n%s", b.String())
	}
}

// Update seq changes cluster seq % clusters; a client reads the latest update a response
// carries from the markers in its bytes.
func TestTheLatestUpdateIsReadFromTheMarkers(t *testing.T) {
	if got := latestUpdate(nil); got != -1 {
		t.Errorf("no marker: %d", got)
	}
	var all []byte
	for i := range 5 {
		b, err := proto.Marshal(clusterAt(i, 5, 6)) // updates 0..6 over 5 clusters: 5 and 6 changed clusters 0 and 1 again
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if got := latestUpdate(all); got != 6 {
		t.Errorf("latest update %d, want 6", got)
	}
	if c := clusterAt(3, 5, 6); c.GetAltStatName() != markerOf(3) || c.GetConnectTimeout().AsDuration().Seconds() != 5 {
		t.Errorf("cluster 3 after update 6: %q, %v", c.GetAltStatName(), c.GetConnectTimeout().AsDuration())
	}
	if c := clusterAt(4, 5, 3); c.GetAltStatName() != "" {
		t.Errorf("cluster 4 before any update changed it: %q", c.GetAltStatName())
	}
}

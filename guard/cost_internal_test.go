package guard

import (
	"runtime"
	"testing"

	. "github.com/onsi/gomega"
)

// An ACK costs the guard what it answered and what depends on it, not every name the client
// holds: an ACK of one updated load assignment makes as many allocations (within two) for a
// client of 10,000 clusters and load assignments as for one of 10, where a view of every name
// makes its lists anew (some 13 more). BenchmarkCostOfAnACK has the times.
func TestAnACKCostsWhatItAnsweredNotEveryNameTheClientHolds(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			g := NewWithT(t)
			allocs := map[int]float64{}
			for _, n := range []int{10, 10000} {
				c := newAckingClient(t, delta, n)
				allocs[n] = ackAllocs(t, c, n)
			}
			g.Expect(allocs[10000]).To(BeNumerically("<=", allocs[10]+2), "allocations of an ACK, by names held")
		})
	}
}

// ackAllocs is the allocations of an ACK of c, on average: an update of one of its n load
// assignments, then the ACK of its response, measured.
func ackAllocs(t *testing.T, c *ackingClient, n int) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const runs = 20
	var ms runtime.MemStats
	var total uint64
	for v := 2; v < 2+runs; v++ {
		c.update(v%n, v)
		runtime.ReadMemStats(&ms)
		before := ms.Mallocs
		if c.answer() != 1 {
			t.Fatal("want one response, of the update")
		}
		runtime.ReadMemStats(&ms)
		total += ms.Mallocs - before
	}
	return float64(total) / runs
}

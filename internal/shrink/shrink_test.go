package shrink_test

import (
	"runtime"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/shrink"
)

func TestAMapThatEmptiesGivesItsMemoryBack(t *testing.T) {
	g := NewWithT(t)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var peak shrink.Peak
	m := map[int][64]byte{}
	for i := range 100_000 {
		m[i] = [64]byte{}
	}
	grown := heap()
	for i := range 100_000 {
		delete(m, i)
		m = shrink.Map(m, &peak)
	}
	g.Expect(m).To(BeEmpty())
	after := heap()
	g.Expect(after-before).To(BeNumerically("<", (grown-before)/10), "grown by %d, left %d", grown-before, after-before)

	// A map that stays large is not copied.
	big := map[int]bool{}
	for i := range 1000 {
		big[i] = true
	}
	var p shrink.Peak
	delete(big, 0)
	g.Expect(shrink.Map(big, &p)).To(HaveLen(999))
	for i := 1; i < 500; i++ {
		delete(big, i)
		big = shrink.Map(big, &p)
	}
	g.Expect(big).To(HaveLen(500))
}

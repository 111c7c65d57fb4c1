package engine

import (
	"runtime"
	"runtime/debug"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
)

// TestGrowStackGivesAGoroutineEightKiB parks goroutines that called growStack and reads what
// their stacks hold: about 8 KiB each (the frame is kept, not optimized away).
func TestGrowStackGivesAGoroutineEightKiB(t *testing.T) {
	g := NewWithT(t)
	const n = 1000
	// No collection while it measures: a collection shrinks the stack of a parked goroutine that
	// uses under a quarter of it, which these do once growStack has returned (CI read 5.9 MB).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	inUse := func() int64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.StackInuse)
	}
	before := inUse()
	var started sync.WaitGroup
	release := make(chan struct{})
	var done sync.WaitGroup
	started.Add(n)
	for range n {
		done.Go(func() {
			growStack()
			started.Done()
			<-release
		})
	}
	started.Wait()
	grown := inUse() - before
	close(release)
	done.Wait()
	// 8 KiB each, less what other goroutines of the package (servers of earlier tests winding
	// down) free meanwhile: 6 KiB each leaves 2 MB for that. Without growStack they start at the
	// runtime's starting size, 2 to 4 KiB here (race detector included).
	g.Expect(grown).To(BeNumerically(">=", n*6<<10), "stack bytes in use for %d goroutines", n)
}

package kds

import (
	"runtime"
	"sync"
	"testing"

	. "github.com/onsi/gomega"
)

// TestGrowStackGivesAGoroutineEightKiB parks goroutines that called growStack and reads what
// their stacks hold: 8 KiB each at least (the frame is kept, not optimized away).
func TestGrowStackGivesAGoroutineEightKiB(t *testing.T) {
	g := NewWithT(t)
	const n = 1000
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
	g.Expect(grown).To(BeNumerically(">=", n*8<<10), "stack bytes in use for %d goroutines", n)
}

package serial

import (
	"sync"
	"testing"
	"testing/synctest"

	. "github.com/onsi/gomega"
)

// Work given while the queue is busy waits, in order, and its caller does not: the goroutine
// already running the queue runs it.
func TestWorkRunsOneAtATimeInTheOrderItCame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var q Queue
		var order []int
		release := make(chan struct{})
		running := make(chan struct{})
		go q.Do(func() {
			close(running)
			<-release
			order = append(order, 1)
			q.Do(func() { order = append(order, 3) }) // from inside: after what is queued
		})
		<-running
		q.Do(func() { order = append(order, 2) }) // returns at once: the queue is busy
		g.Expect(order).To(BeEmpty())
		close(release)
		synctest.Wait()
		g.Expect(order).To(Equal([]int{1, 2, 3}))

		q.Do(func() { order = append(order, 4) }) // idle: runs on the caller's goroutine
		g.Expect(order).To(Equal([]int{1, 2, 3, 4}))
	})
}

func TestNoTwoPiecesOfWorkOverlap(t *testing.T) {
	var q Queue
	var wg sync.WaitGroup
	running, most, done := 0, 0, 0
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				q.Do(func() {
					running++
					most = max(most, running)
					done++
					running--
				})
			}
		})
	}
	wg.Wait() // every Do has returned: the work they queued is done
	if most != 1 || done != 8000 {
		t.Fatalf("at most %d at once (want 1), %d done (want 8000)", most, done)
	}
}

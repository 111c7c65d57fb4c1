package engine

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
)

// Streams that arrive together are served at ADSConfig.Arrivals' rate: the burst at once, the
// rest each at its turn, and those whose turn is further than ArrivalWait away are refused at
// once (Unavailable, counted as "arrivals"), so that a fleet arriving at once queues no longer
// than the wait.
func TestStreamsArriveAtTheirRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"Mesh"})
		defer c.Close()
		var mu sync.Mutex
		var refusals []event.Refusal
		tr := NewTracker(c, event.Observer{Refused: func(r event.Refusal) {
			mu.Lock()
			defer mu.Unlock()
			refusals = append(refusals, r)
		}})
		a := c.DeltaADS(t.Context(), tr, ADSConfig{Arrivals: RateLimit{Rate: 1, Burst: 2}, ArrivalWait: 3 * time.Second}).(*ads)

		start := time.Now()
		served := make([]time.Duration, 6)
		errs := make([]error, 6)
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				errs[i] = a.arrive(context.Background(), "zone")
				served[i] = time.Since(start)
			})
			synctest.Wait() // in order
		}
		wg.Wait()
		g.Expect(errs[:5]).To(HaveEach(BeNil()))
		g.Expect(served[:5]).To(Equal([]time.Duration{0, 0, time.Second, 2 * time.Second, 3 * time.Second}))
		g.Expect(status.Code(errs[5])).To(Equal(codes.Unavailable))
		g.Expect(served[5]).To(BeZero(), "refused at once, not after waiting")
		g.Expect(refusals).To(ConsistOf(HaveField("Reason", "arrivals")))

		// A stream that ends while it waits gives its turn back.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.arrive(ctx, "zone") }()
		synctest.Wait()
		cancel()
		g.Expect(status.Code(<-done)).To(Equal(codes.Canceled))
		before := time.Now()
		g.Expect(a.arrive(context.Background(), "zone")).To(Succeed())
		g.Expect(time.Since(before)).To(BeNumerically("<=", time.Second))

		// Without a rate, no stream waits.
		free := c.DeltaADS(t.Context(), tr, ADSConfig{}).(*ads)
		for range 100 {
			g.Expect(free.arrive(context.Background(), "zone")).To(Succeed())
		}
		g.Expect(time.Since(before)).To(BeNumerically("<=", time.Second))
	})
}

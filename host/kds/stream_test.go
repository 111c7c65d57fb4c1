package kds

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/resource"
)

// fakeStream is a delta stream without gRPC: the test sends the zone's requests and reads what
// the loop sends.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	reqs chan *discovery.DeltaDiscoveryRequest
	sent chan *discovery.DeltaDiscoveryResponse
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Send(r *discovery.DeltaDiscoveryResponse) error {
	f.sent <- r
	return nil
}

func (f *fakeStream) Recv() (*discovery.DeltaDiscoveryRequest, error) {
	select {
	case r := <-f.reqs:
		return r, nil
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
}

// loopZone is one zone's stream served by serveDelta.
type loopZone struct {
	str    *fakeStream
	cancel context.CancelFunc
	done   chan error
}

func startLoopZone(c *Cache, tr *Tracker, id int64, zone string) *loopZone {
	ctx, cancel := context.WithCancelCause(context.Background())
	z := &loopZone{done: make(chan error, 1), cancel: func() { cancel(nil) }}
	z.str = &fakeStream{ctx: ctx, reqs: make(chan *discovery.DeltaDiscoveryRequest), sent: make(chan *discovery.DeltaDiscoveryResponse, 8)}
	sctx := context.WithValue(ctx, streamKey{}, &streamInfo{zone: zone, close: cancel, loop: true})
	go func() { z.done <- serveDelta(sctx, id, z.str, c, tr) }()
	z.str.reqs <- &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: zone}, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"*"}}
	return z
}

func (z *loopZone) ack(r *discovery.DeltaDiscoveryResponse) {
	z.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResponseNonce: r.Nonce}
}

// The stream loop sends a session's responses itself, a few streams at a time when the budget is
// short: a response waits for room until another zone answers, never longer than budgetMaxWait;
// a request that replaces the watch of a waiting response takes it back (its names are sent in
// the next); and a closed stream gives its room back.
func TestTheStreamLoopSendsWhenTheBudgetHasRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		tr.SetLimits(Limits{MaxInFlightBytes: 1}) // one response at a time
		var b SnapshotBuilder
		s, err := b.Build([]resource.Resource{{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{}`), Generation: 1}})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)

		zones := []*loopZone{startLoopZone(c, tr, 1, "z1"), startLoopZone(c, tr, 2, "z2"), startLoopZone(c, tr, 3, "z3")}
		synctest.Wait()
		var first, waiting []*loopZone
		for _, z := range zones {
			if len(z.str.sent) == 1 {
				first = append(first, z)
			} else {
				waiting = append(waiting, z)
			}
		}
		g.Expect(first).To(HaveLen(1), "one response fits")

		// A waiting zone asks again: its pending response is taken back, and answered anew.
		again := waiting[0]
		again.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout"}
		synctest.Wait()
		g.Expect(again.str.sent).To(BeEmpty(), "still no room")

		first[0].ack(<-first[0].str.sent)
		synctest.Wait()
		var second *loopZone
		for _, z := range waiting {
			if len(z.str.sent) == 1 {
				second = z
			}
		}
		g.Expect(second).NotTo(BeNil(), "the ACK made room for the next zone")
		last := waiting[0]
		if last == second {
			last = waiting[1]
		}
		g.Expect(last.str.sent).To(BeEmpty())

		// The second zone never answers: the last waits budgetMaxWait, no longer.
		r := <-second.str.sent
		g.Expect(r.Resources).To(HaveLen(1))
		time.Sleep(budgetMaxWait - time.Nanosecond)
		synctest.Wait()
		g.Expect(last.str.sent).To(BeEmpty())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		g.Expect(last.str.sent).To(HaveLen(1))
		r = <-last.str.sent
		g.Expect(r.Resources).To(HaveLen(1), "what was taken back is in the answer")
		g.Expect(r.Resources[0].Name).To(Equal(s.Names("MeshTimeout")[0]))

		// Closed streams end their loops and give their room back.
		for _, z := range zones {
			z.cancel()
			g.Expect(<-z.done).To(Succeed())
		}
		g.Expect(c.budget.inUse()).To(BeZero())
	})
}

// A cache closing under open streams ends each stream loop through its stream's context, whose
// cause (codes.Unavailable) is what the zone is told; a stream that ends on its own is not given
// that cause.
func TestACacheClosingEndsTheStreamLoops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		tr := NewTracker(c)
		var b SnapshotBuilder
		s, err := b.Build([]resource.Resource{{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{}`), Generation: 1}})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)

		ended := startLoopZone(c, tr, 1, "z1")
		open := startLoopZone(c, tr, 2, "z2")
		synctest.Wait()
		ended.cancel() // its RPC ends
		g.Expect(<-ended.done).To(Succeed())
		g.Expect(context.Cause(ended.str.ctx)).To(MatchError(context.Canceled), "not the cache's cause")

		c.Close()
		g.Expect(<-open.done).To(Succeed(), "the loop ends")
		g.Expect(status.Code(context.Cause(open.str.ctx))).To(Equal(codes.Unavailable), "the zone is told why")
	})
}

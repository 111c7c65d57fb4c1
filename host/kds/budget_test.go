package kds

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

func TestTheBudgetAdmitsWhatFitsAndWhatWaitedLongEnough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		b := newBudget(100)
		stop := make(chan struct{})
		g.Expect(b.acquire(500, stop, nil)).To(BeTrue(), "larger than the limit, alone")
		got := make(chan bool, 1)
		go func() { got <- b.acquire(10, stop, nil) }()
		synctest.Wait()
		g.Expect(got).NotTo(Receive(), "no room")
		b.release(500)
		synctest.Wait()
		g.Expect(got).To(Receive(BeTrue()))
		g.Expect(b.acquire(90, stop, nil)).To(BeTrue(), "fits")

		start := time.Now()
		go func() { got <- b.acquire(10, stop, nil) }()
		synctest.Wait()
		g.Expect(got).NotTo(Receive())
		time.Sleep(budgetMaxWait)
		synctest.Wait()
		g.Expect(got).To(Receive(BeTrue()), "waited long enough: over the limit")
		g.Expect(time.Since(start)).To(Equal(budgetMaxWait))
		g.Expect(b.inUse()).To(Equal(int64(110)))

		go func() { got <- b.acquire(10, stop, nil) }()
		synctest.Wait()
		close(stop)
		synctest.Wait()
		g.Expect(got).To(Receive(BeFalse()), "the stream closed: nothing taken")
		g.Expect(b.inUse()).To(Equal(int64(110)))
	})
}

// budgetZone is one zone stream driven as the delta server drives it, without gRPC: the tracker's
// callbacks, and the cache's watch with the channel the server reads.
type budgetZone struct {
	t     *testing.T
	tr    *Tracker
	c     *Cache
	id    int64
	out   chan cache.DeltaResponse
	nonce int
}

func (z *budgetZone) subscribe(name string) {
	req := &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: name}, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"*"}}
	if err := z.tr.OnStreamDeltaRequest(z.id, req); err != nil {
		z.t.Fatal(err)
	}
	if _, err := z.c.CreateDeltaWatch(req, stream.NewDeltaSubscription([]string{"*"}, nil, nil, false), z.out); err != nil {
		z.t.Fatal(err)
	}
}

// sendAndACK plays the server sending resp, and the zone ACKing it.
func (z *budgetZone) sendAndACK(resp cache.DeltaResponse) {
	z.nonce++
	r, _ := resp.GetDeltaDiscoveryResponse()
	r.Nonce = string(rune('a' + z.nonce))
	z.tr.OnStreamDeltaResponse(z.id, nil, r)
	if err := z.tr.OnStreamDeltaRequest(z.id, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "x"}, TypeUrl: "MeshTimeout", ResponseNonce: r.Nonce}); err != nil {
		z.t.Fatal(err)
	}
}

// A full sync of several zones goes a few at a time: a zone's response waits for room in the
// budget until another zone answers what it was sent (or its stream closes), and is never stuck
// behind one that does not answer for longer than budgetMaxWait.
func TestResponsesWaitForRoomUntilAZoneAnswers(t *testing.T) {
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

		zones := make([]*budgetZone, 3)
		for i := range zones {
			zones[i] = &budgetZone{t: t, tr: tr, c: c, id: int64(i + 1), out: make(chan cache.DeltaResponse, 1)}
			g.Expect(tr.OnDeltaStreamOpen(context.Background(), zones[i].id, "")).To(Succeed())
			zones[i].subscribe(string(rune('a' + i)))
		}
		synctest.Wait()
		var first, waiting []*budgetZone
		for _, z := range zones {
			if len(z.out) == 1 {
				first = append(first, z)
			} else {
				waiting = append(waiting, z)
			}
		}
		g.Expect(first).To(HaveLen(1), "one response fits")
		g.Expect(c.budget.inUse()).To(BeNumerically(">", 1))

		first[0].sendAndACK(<-first[0].out)
		synctest.Wait()
		var second *budgetZone
		for _, z := range waiting {
			if len(z.out) == 1 {
				second = z
			}
		}
		g.Expect(second).NotTo(BeNil(), "the ACK made room for the next zone")
		last := waiting[0]
		if last == second {
			last = waiting[1]
		}
		g.Expect(last.out).To(BeEmpty())

		// The second zone never answers: the last waits budgetMaxWait, no longer.
		<-second.out
		time.Sleep(budgetMaxWait - time.Nanosecond)
		synctest.Wait()
		g.Expect(last.out).To(BeEmpty())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		g.Expect(last.out).To(HaveLen(1))

		// Closed streams give their room back.
		for _, z := range zones {
			tr.OnDeltaStreamClosed(z.id, nil)
		}
		g.Expect(c.budget.inUse()).To(BeZero())
	})
}

// Room that comes back goes to the waiters in the order they came, and wakes only those it was
// taken for; a waiter that leaves gives back what it was granted, to the next.
func TestTheBudgetGrantsWaitersInOrderAndWakesOnlyThem(t *testing.T) {
	g := NewWithT(t)
	b := newBudget(100)
	g.Expect(b.tryAcquire(100)).To(BeNil(), "fits")
	w1, w2, w3 := b.tryAcquire(60), b.tryAcquire(30), b.tryAcquire(20)
	g.Expect([]*budgetWaiter{w1, w2, w3}).NotTo(ContainElement(BeNil()), "no room: all wait")
	w0 := b.tryAcquire(1)
	g.Expect(w0).NotTo(BeNil(), "a small one waits behind them")

	b.release(50) // 50 used: the first (60) does not fit, so nobody passes it
	g.Expect(w1.ready).NotTo(Receive())
	g.Expect(w2.ready).NotTo(Receive(), "in order: the second waits behind the first")

	b.release(50) // nothing used: the first, then the second (90) fit; the third (110) does not
	g.Expect(w1.ready).To(Receive())
	g.Expect(w2.ready).To(Receive())
	g.Expect(w3.ready).NotTo(Receive())
	g.Expect(b.inUse()).To(Equal(int64(90)))

	b.cancel(w2) // granted, then gone: its room goes to the third, then the small one
	g.Expect(w3.ready).To(Receive())
	g.Expect(w0.ready).To(Receive())
	g.Expect(b.inUse()).To(Equal(int64(81)))

	w4 := b.tryAcquire(50)
	g.Expect(w4).NotTo(BeNil())
	b.force(w4) // its deadline: over the limit
	g.Expect(b.inUse()).To(Equal(int64(131)))
	b.release(131)
	g.Expect(w4.ready).NotTo(Receive(), "forced, not granted: nothing to wake")
}

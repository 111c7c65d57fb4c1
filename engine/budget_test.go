package engine

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

func TestTheBudgetAdmitsWhatFitsAndWaitsForTheRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		b := newBudget(100)
		b.opened()
		b.opened() // two streams: a share of 50 each
		var a, other budgetAccount
		stop := make(chan struct{})
		g.Expect(b.acquire(&a, 500, stop, nil)).To(BeTrue(), "larger than the limit, alone")
		got := make(chan bool, 1)
		go func() { got <- b.acquire(&other, 60, stop, nil) }()
		synctest.Wait()
		g.Expect(got).NotTo(Receive(), "no room, and over its share")
		b.release(&a, 500)
		synctest.Wait()
		g.Expect(got).To(Receive(BeTrue()))
		g.Expect(b.acquire(&a, 40, stop, nil)).To(BeTrue(), "fits")

		go func() { got <- b.acquire(&a, 20, stop, nil) }()
		synctest.Wait()
		g.Expect(got).NotTo(Receive(), "no room, and over its share (40 held)")
		time.Sleep(time.Hour)
		synctest.Wait()
		g.Expect(got).NotTo(Receive(), "waiting long is no reason to go over the limit")
		close(stop)
		synctest.Wait()
		g.Expect(got).To(Receive(BeFalse()), "the stream closed: nothing taken")
		g.Expect(b.inUse()).To(Equal(int64(100)))
	})
}

// A stream's share of the limit is its own: what fits in it goes at once, whoever waits and
// however full the pool is, so a zone that does not read only holds what it was given. The
// shares add up to the limit.
func TestAResponseWithinItsStreamsShareNeverWaits(t *testing.T) {
	g := NewWithT(t)
	b := newBudget(100)
	slow := make([]budgetAccount, 4)
	var healthy budgetAccount
	for range 5 {
		b.opened() // a share of 20 each
	}
	g.Expect(b.tryAcquire(&slow[0], 100)).To(BeNil(), "the pool")
	for i := 1; i < len(slow); i++ {
		g.Expect(b.tryAcquire(&slow[i], 50)).NotTo(BeNil(), "over its share, and no room in the pool")
	}
	g.Expect(b.tryAcquire(&healthy, 15)).To(BeNil(), "within its share, ahead of the waiters")
	g.Expect(b.tryAcquire(&healthy, 5)).To(BeNil(), "its share is 20")
	w := b.tryAcquire(&healthy, 1)
	g.Expect(w).NotTo(BeNil(), "past its share it waits in line")
	g.Expect(b.inUse()).To(Equal(int64(120)))

	b.release(&healthy, 15) // its own answer: its waiter now fits in its share
	g.Expect(w.ready).To(Receive())
	g.Expect(b.inUse()).To(Equal(int64(106)))
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
// budget until another zone answers what it was sent, or its stream closes.
func TestResponsesWaitForRoomUntilAZoneAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		tr.SetLimits(Limits{MaxInFlightBytes: 1}) // one response at a time
		var b testSnapshots
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

		// The second zone never answers: the last waits, until the second's stream closes
		// and gives its room back.
		<-second.out
		time.Sleep(time.Hour)
		synctest.Wait()
		g.Expect(last.out).To(BeEmpty())
		tr.OnDeltaStreamClosed(second.id, nil)
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
	b := newBudget(100) // no stream opened: no share
	var a, a1, a2, a3, a0 budgetAccount
	g.Expect(b.tryAcquire(&a, 100)).To(BeNil(), "fits")
	w1, w2, w3 := b.tryAcquire(&a1, 60), b.tryAcquire(&a2, 30), b.tryAcquire(&a3, 20)
	g.Expect([]*budgetWaiter{w1, w2, w3}).NotTo(ContainElement(BeNil()), "no room: all wait")
	w0 := b.tryAcquire(&a0, 1)
	g.Expect(w0).NotTo(BeNil(), "a small one waits behind them")

	b.release(&a, 50) // 50 used: the first (60) does not fit, so nobody passes it
	g.Expect(w1.ready).NotTo(Receive())
	g.Expect(w2.ready).NotTo(Receive(), "in order: the second waits behind the first")

	b.release(&a, 50) // nothing used: the first, then the second (90) fit; the third (110) does not
	g.Expect(w1.ready).To(Receive())
	g.Expect(w2.ready).To(Receive())
	g.Expect(w3.ready).NotTo(Receive())
	g.Expect(b.inUse()).To(Equal(int64(90)))

	b.cancel(w2) // granted, then gone: its room goes to the third, then the small one
	g.Expect(w3.ready).To(Receive())
	g.Expect(w0.ready).To(Receive())
	g.Expect(b.inUse()).To(Equal(int64(81)))
	g.Expect([]int64{a1.held, a2.held, a3.held, a0.held}).To(Equal([]int64{60, 0, 20, 1}))
}

// inUse is the room taken now.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

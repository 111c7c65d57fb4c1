package kds

import (
	"slices"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// budget bounds the bytes of the responses the global has handed to the delta server and the
// zones have not answered yet, across every stream. gRPC encodes a response when the server
// sends it and keeps the encoded message until the zone has read it, so a full sync of every
// zone at once would otherwise hold every zone's whole state encoded at the same time (100
// zones x 10,000 resources: hundreds of MB at the peak). A sender waits for room before it hands
// a response over; the room comes back when the zone answers it (ACK or NACK), when it is
// forgotten (MaxInFlight) or taken back, and when its stream closes.
//
// Invariants (under mu):
//   - used is the sum of the costs of the responses that hold room (inflight.cost > 0) and of
//     the waiters granted room whose response is not sent yet.
//   - A response is admitted when it fits and nobody waits before it, or when nothing holds room
//     (one larger than the limit goes alone), or when it has waited maxWait: a zone that never
//     answers slows the others by maxWait a response at most; it never stops them. Waiters get
//     room in the order they came, as it comes back (release).
type budget struct {
	mu      sync.Mutex
	limit   int64           // 0: unbounded
	used    int64           // bytes of the responses that hold room
	waiters []*budgetWaiter // in the order they came: room goes to the first that fits
	maxWait time.Duration
}

// budgetWaiter is a response waiting for room: when room comes back, release takes it on the
// waiter's behalf and signals ready. A waiter is woken once, when it got its room, and no other
// waiter is woken for it: with thousands of streams waiting in a full sync, a release wakes the
// one or few that now fit, not all of them.
type budgetWaiter struct {
	n       int64
	ready   chan struct{} // capacity 1: signalled once, when granted
	granted bool
}

// budgetMaxWait is how long a response waits for room at most.
const budgetMaxWait = 5 * time.Second

func newBudget(limit int64) *budget {
	return &budget{limit: limit, maxWait: budgetMaxWait}
}

// setLimit changes the limit (0: unbounded); call it before serving.
func (b *budget) setLimit(limit int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.limit = limit
}

// acquire waits for room for n bytes and takes it, and reports true; or returns false, taking
// nothing, when stop or gone closes first.
func (b *budget) acquire(n int64, stop, gone <-chan struct{}) bool {
	w := b.tryAcquire(n)
	if w == nil {
		return true
	}
	t := time.NewTimer(b.maxWait)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
		b.force(w) // waited long enough: over the limit, rather than stalled by a zone that does not answer
	case <-stop:
		b.cancel(w)
		return false
	case <-gone:
		b.cancel(w)
		return false
	}
	return true
}

// fits reports whether n bytes fit now. Call with b.mu.
func (b *budget) fits(n int64) bool {
	return b.limit <= 0 || b.used == 0 || b.used+n <= b.limit
}

// tryAcquire takes room for n bytes and returns nil when it fits now and nobody waits before it;
// otherwise it takes nothing and returns the waiter, queued, whose ready is signalled once room
// was taken for it.
func (b *budget) tryAcquire(n int64) *budgetWaiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiters) == 0 && b.fits(n) {
		b.used += n
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{}, 1)}
	b.waiters = append(b.waiters, w)
	return w
}

// force gives w its room whether it fits or not (it waited maxWait), unless it got it already.
func (b *budget) force(w *budgetWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.granted {
		return
	}
	b.dequeue(w)
	w.granted = true
	b.used += w.n
}

// cancel takes w out of the queue, and gives back its room if it got it meanwhile.
func (b *budget) cancel(w *budgetWaiter) {
	b.mu.Lock()
	if !w.granted {
		b.dequeue(w)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.release(w.n)
}

// dequeue takes w out of the queue. Call with b.mu.
func (b *budget) dequeue(w *budgetWaiter) {
	if i := slices.Index(b.waiters, w); i >= 0 {
		b.waiters = slices.Delete(b.waiters, i, i+1)
	}
}

// release gives back n bytes of room, and takes it for the waiters that now fit, in order.
func (b *budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	i := 0
	for ; i < len(b.waiters) && b.fits(b.waiters[i].n); i++ {
		w := b.waiters[i]
		w.granted = true
		b.used += w.n
		w.ready <- struct{}{}
	}
	if i > 0 {
		clear(b.waiters[:i])
		b.waiters = b.waiters[i:] // no copy: the next append that grows it leaves the front behind
	}
}

// inUse is the room taken now.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// responseCost estimates the bytes of a response on the wire: what it carries, without encoding
// it.
func responseCost(resp *discovery.DeltaDiscoveryResponse) int64 {
	n := int64(64)
	for _, r := range resp.Resources {
		n += int64(len(r.Name)+len(r.Version)+len(r.GetResource().GetTypeUrl())+len(r.GetResource().GetValue())) + 16
	}
	for _, name := range resp.RemovedResources {
		n += int64(len(name)) + 2
	}
	return n
}

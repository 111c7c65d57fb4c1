package engine

import (
	"slices"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// budget bounds the bytes of the responses handed to the gRPC server and not answered yet: a
// response takes room before it is handed over, until it is answered, forgotten or taken back,
// or its stream closes. A response goes at once when it fits in its stream's share (limit /
// streams open); otherwise when it fits in the pool (limit) and nobody waits before it, or
// alone when nothing holds room.
type budget struct {
	mu      sync.Mutex      // guards every field, and each budgetAccount's
	limit   int64           // 0: unbounded
	streams int64           // open streams, each with a share of limit
	used    int64           // bytes of the responses that hold room
	waiters []*budgetWaiter // in the order they came: room goes to the first that fits
}

// budgetAccount is one stream's room in the budget, and its waiter (guarded by budget.mu).
type budgetAccount struct {
	held   int64
	waiter *budgetWaiter
}

// budgetWaiter is a response waiting for room: release takes the room on its behalf and
// signals ready, waking only the waiters that now fit.
type budgetWaiter struct {
	n       int64
	acct    *budgetAccount
	ready   chan struct{} // capacity 1: signalled once, when granted
	granted bool
}

func newBudget(limit int64) *budget { return &budget{limit: limit} }

// setLimit changes the limit (0: unbounded); call it before serving.
func (b *budget) setLimit(limit int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.limit = limit
}

// opened and closed count the streams that share the limit.
func (b *budget) opened() { b.addStreams(1) }
func (b *budget) closed() { b.addStreams(-1) }

func (b *budget) addStreams(n int64) {
	b.mu.Lock()
	b.streams += n
	b.mu.Unlock()
}

// acquire waits for room for n bytes for a's stream and takes it, and reports true; or returns
// false, taking nothing, when stop or gone closes first.
func (b *budget) acquire(a *budgetAccount, n int64, stop, gone <-chan struct{}) bool {
	w := b.tryAcquire(a, n)
	if w == nil {
		return true
	}
	select {
	case <-w.ready:
		return true
	case <-stop:
	case <-gone:
	}
	b.cancel(w)
	return false
}

// fits reports whether n bytes of a's stream fit now: in its share, or in the pool when nobody
// waits before them (first: they are the first waiter). Call with b.mu.
func (b *budget) fits(a *budgetAccount, n int64, first bool) bool {
	return b.limit <= 0 || b.used == 0 || (b.streams > 0 && a.held+n <= b.limit/b.streams) ||
		((first || len(b.waiters) == 0) && b.used+n <= b.limit)
}

// tryAcquire takes room for n bytes of a's stream and returns nil when they fit now; otherwise
// it returns a queued waiter, whose ready is signalled once room was taken for it.
func (b *budget) tryAcquire(a *budgetAccount, n int64) *budgetWaiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fits(a, n, false) {
		b.take(a, n)
		return nil
	}
	w := &budgetWaiter{n: n, acct: a, ready: make(chan struct{}, 1)}
	a.waiter = w
	b.waiters = append(b.waiters, w)
	return w
}

// take gives n bytes of room to a's stream. Call with b.mu.
func (b *budget) take(a *budgetAccount, n int64) {
	b.used += n
	a.held += n
}

// grant gives w its room and wakes it. Call with b.mu, w out of the queue.
func (b *budget) grant(w *budgetWaiter) {
	w.granted = true
	w.acct.waiter = nil
	b.take(w.acct, w.n)
	w.ready <- struct{}{}
}

// cancel takes w out of the queue, and gives back its room if it got it meanwhile.
func (b *budget) cancel(w *budgetWaiter) {
	b.mu.Lock()
	if !w.granted {
		b.dequeue(w)
		if w.acct.waiter == w {
			w.acct.waiter = nil
		}
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.release(w.acct, w.n)
}

// dequeue takes w out of the queue. Call with b.mu.
func (b *budget) dequeue(w *budgetWaiter) {
	if i := slices.Index(b.waiters, w); i >= 0 {
		b.waiters = slices.Delete(b.waiters, i, i+1)
	}
}

// release gives back n bytes of a's stream, and takes room for the waiters that now fit: in
// order, the first ones that fit in the pool; then a's own waiter, if it now fits in its share.
func (b *budget) release(a *budgetAccount, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	a.held -= n
	i := 0
	for ; i < len(b.waiters) && b.fits(b.waiters[i].acct, b.waiters[i].n, true); i++ {
		b.grant(b.waiters[i])
	}
	clear(b.waiters[:i])
	b.waiters = b.waiters[i:]
	if w := a.waiter; w != nil && b.fits(a, w.n, false) {
		b.dequeue(w)
		b.grant(w)
	}
}

// responseCost estimates the bytes of a response on the wire, without encoding it.
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

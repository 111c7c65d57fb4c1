package kds

import (
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
//   - used is the sum of the costs of the responses that hold room (inflight.cost > 0).
//   - A response is admitted when it fits, or when nothing holds room (one larger than the limit
//     goes alone), or when it has waited maxWait: a zone that never answers slows the others by
//     maxWait a response at most; it never stops them.
type budget struct {
	mu      sync.Mutex
	limit   int64         // 0: unbounded
	used    int64         // bytes of the responses that hold room
	freed   chan struct{} // closed, and replaced, when room comes back
	maxWait time.Duration
}

// budgetMaxWait is how long a response waits for room at most.
const budgetMaxWait = 5 * time.Second

func newBudget(limit int64) *budget {
	return &budget{limit: limit, freed: make(chan struct{}), maxWait: budgetMaxWait}
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
	var deadline <-chan time.Time
	for {
		freed, ok := b.tryAcquire(n)
		if ok {
			return true
		}
		if deadline == nil {
			t := time.NewTimer(b.maxWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-freed:
		case <-deadline:
			b.take(n) // waited long enough: over the limit, rather than stalled by a zone that does not answer
			return true
		case <-stop:
			return false
		case <-gone:
			return false
		}
	}
}

// tryAcquire takes room for n bytes and reports true when it fits now; otherwise it takes
// nothing and returns a channel closed when room comes back.
func (b *budget) tryAcquire(n int64) (freed <-chan struct{}, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit <= 0 || b.used == 0 || b.used+n <= b.limit {
		b.used += n
		return nil, true
	}
	return b.freed, false
}

// take takes room for n bytes whether it fits or not: for a response that waited maxWait.
func (b *budget) take(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used += n
}

// release gives back n bytes of room.
func (b *budget) release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
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

package owner

// The work queue: which zones have a check to run, and what each check looks at.
//
// Invariants, all under Holds.mu:
//   - A zone is in Holds.scheduled from the moment it is queued until the worker that took it
//     has finished checking it. So a zone is in the queue at most once, and is checked by at
//     most one worker at a time; a zone that gets work while it is checked is not queued again
//     then, but by its worker when the check ends (the work is still pending).
//   - A zone's pending work is what its next check looks at; a check takes it all and leaves it
//     empty.
//   - zoneQueue's ring holds the queued zones in order from head, n of them; its other slots are
//     empty. A push or a pop moves no other zone; only growing the ring copies them.

import (
	"context"
	"maps"

	"github.com/kds-host/kds-host/engine"
)

// pending is a zone's work: what its next check looks at.
type pending struct {
	full bool                // everything
	keys map[engine.Ref]bool // else these keys (and their owners); read-only when shared
	// shared: keys is a write's changed keys, given to every zone that had no other work
	// (addWrite), and copied before it is added to.
	shared bool
}

func (p *pending) addWork(k engine.Ref) {
	if p.full || p.keys[k] {
		return // everything is looked at anyway, or k already is
	}
	if p.keys == nil || p.shared {
		keys := make(map[engine.Ref]bool, len(p.keys)+1)
		maps.Copy(keys, p.keys)
		p.keys, p.shared = keys, false
	}
	p.keys[k] = true
}

// addWrite adds a write's changed keys, read-only: a zone with no other work shares the map with
// the others (a write every zone checks costs no map per zone).
func (p *pending) addWrite(keys map[engine.Ref]bool) {
	switch {
	case p.full:
	case len(p.keys) == 0:
		p.keys, p.shared = keys, true
	default:
		for k := range keys {
			p.addWork(k)
		}
	}
}

// has reports whether there is work.
func (p *pending) has() bool { return p.full || len(p.keys) > 0 }

// enqueue queues zones with work, once each; a zone being checked is queued again by its worker.
func (h *Holds) enqueue(zones ...string) {
	h.mu.Lock()
	for _, z := range zones {
		if !h.scheduled[z] {
			h.scheduled[z] = true
			h.queue.push(z)
		}
	}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// work is one worker: it checks the queued zones, one at a time.
func (h *Holds) work(ctx context.Context) {
	for {
		zone, ok := h.take()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-h.wake:
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		h.check(ctx, zone)
		h.mu.Lock()
		delete(h.scheduled, zone)
		z := h.zones[zone]
		again := z != nil && z.open && z.has()
		h.mu.Unlock()
		if again {
			h.enqueue(zone) // work arrived while it was checked
		}
	}
}

// take pops the next queued zone, and wakes another worker when more are queued.
func (h *Holds) take() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	zone, ok := h.queue.pop()
	if !ok {
		return "", false
	}
	if h.queue.len() > 0 {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	return zone, true
}

// zoneQueue is a first-in first-out queue of zone names: a ring that doubles when full.
type zoneQueue struct {
	ring    []string
	head, n int
	moves   int // zones copied to grow the ring, so far: what a test counts
}

// minRing is the smallest ring; a ring larger than that is dropped when it empties.
const minRing = 16

func (q *zoneQueue) push(zone string) {
	if q.n == len(q.ring) {
		ring := make([]string, max(minRing, 2*len(q.ring)))
		k := copy(ring, q.ring[q.head:])
		copy(ring[k:], q.ring[:q.head])
		q.moves += q.n
		q.ring, q.head = ring, 0
	}
	q.ring[(q.head+q.n)%len(q.ring)] = zone
	q.n++
}

func (q *zoneQueue) pop() (string, bool) {
	if q.n == 0 {
		return "", false
	}
	zone := q.ring[q.head]
	q.ring[q.head] = ""
	q.head, q.n = (q.head+1)%len(q.ring), q.n-1
	if q.n == 0 && len(q.ring) > minRing {
		q.ring, q.head = nil, 0 // a burst's ring is not kept
	}
	return zone, true
}

func (q *zoneQueue) len() int { return q.n }

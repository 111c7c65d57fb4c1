package owner

// The work queue: which nodes have a check to run, and what each check looks at.
//
// Invariants, all under Holds.mu:
//   - A node is in Holds.scheduled from the moment it is queued until the worker that took it
//     has finished checking it. So a node is in the queue at most once, and is checked by at
//     most one worker at a time; a node that gets work while it is checked is not queued again
//     then, but by its worker when the check ends (the work is still pending).
//   - A node's pending work is what its next check looks at; a check takes it all and leaves it
//     empty.
//   - nodeQueue's ring holds the queued nodes in order from head, n of them; its other slots are
//     empty. A push or a pop moves no other node; only growing the ring copies them.

import (
	"context"
	"maps"

	"github.com/kds-host/kds-host/engine"
)

// pending is a node's work: what its next check looks at.
type pending struct {
	full bool                // everything
	keys map[engine.Ref]bool // else these keys (and their owners); read-only when shared
	// shared: keys is a write's changed keys, given to every node that had no other work
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

// addWrite adds a write's changed keys, read-only: a node with no other work shares the map with
// the others (a write every node checks costs no map per node).
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

// enqueue queues nodes with work, once each; a node being checked is queued again by its worker.
func (h *Holds) enqueue(nodes ...string) {
	h.mu.Lock()
	for _, z := range nodes {
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

// work is one worker: it checks the queued nodes, one at a time.
func (h *Holds) work(ctx context.Context) {
	for {
		node, ok := h.take()
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
		h.check(ctx, node)
		h.mu.Lock()
		delete(h.scheduled, node)
		z := h.nodes[node]
		again := z != nil && z.open && z.has()
		h.mu.Unlock()
		if again {
			h.enqueue(node) // work arrived while it was checked
		}
	}
}

// take pops the next queued node, and wakes another worker when more are queued.
func (h *Holds) take() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	node, ok := h.queue.pop()
	if !ok {
		return "", false
	}
	if h.queue.len() > 0 {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	return node, true
}

// nodeQueue is a first-in first-out queue of node names: a ring that doubles when full.
type nodeQueue struct {
	ring    []string
	head, n int
	moves   int // nodes copied to grow the ring, so far: what a test counts
}

// minRing is the smallest ring; a ring larger than that is dropped when it empties.
const minRing = 16

func (q *nodeQueue) push(node string) {
	if q.n == len(q.ring) {
		ring := make([]string, max(minRing, 2*len(q.ring)))
		k := copy(ring, q.ring[q.head:])
		copy(ring[k:], q.ring[:q.head])
		q.moves += q.n
		q.ring, q.head = ring, 0
	}
	q.ring[(q.head+q.n)%len(q.ring)] = node
	q.n++
}

func (q *nodeQueue) pop() (string, bool) {
	if q.n == 0 {
		return "", false
	}
	node := q.ring[q.head]
	q.ring[q.head] = ""
	q.head, q.n = (q.head+1)%len(q.ring), q.n-1
	if q.n == 0 && len(q.ring) > minRing {
		q.ring, q.head = nil, 0 // a burst's ring is not kept
	}
	return node, true
}

func (q *nodeQueue) len() int { return q.n }

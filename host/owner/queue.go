package owner

// The work queue: which zones have a check to run, and what each check looks at.
//
// Invariants, all under Holds.mu:
//   - A zone is in inQ from the moment it is queued until the worker that took it has finished
//     checking it, so it is in the queue at most once and checked by at most one worker at a
//     time.
//   - A zone's pending work (full, keys) is what its next check looks at; a check takes it all
//     and leaves it empty, and the worker that finishes a check queues the zone again when new
//     work arrived meanwhile.

import (
	"context"
	"slices"

	"github.com/kds-host/kds-host/host/resource"
)

func (z *zoneHolds) addWork(k resource.Key) {
	if z.full {
		return // everything is looked at anyway
	}
	if z.keys == nil {
		z.keys = map[resource.Key]bool{}
	}
	z.keys[k] = true
}

// enqueue puts zones with work in the queue, once each.
func (h *Holds) enqueue(zones ...string) {
	h.mu.Lock()
	for _, z := range zones {
		if !h.inQ[z] {
			h.inQ[z] = true
			h.queue = append(h.queue, z)
		}
	}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// work is one worker: it checks the queued zones, one at a time each.
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
		delete(h.inQ, zone)
		z := h.zones[zone]
		again := z != nil && z.open && (z.full || len(z.keys) > 0)
		if z != nil {
			z.busy = false
		}
		h.mu.Unlock()
		if again {
			h.enqueue(zone) // work arrived while it was checked
		}
	}
}

// take pops a zone that no worker is checking.
func (h *Holds) take() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, zone := range h.queue {
		if z := h.zones[zone]; z != nil && z.busy {
			continue
		}
		h.queue = slices.Delete(h.queue, i, i+1)
		if len(h.queue) == 0 {
			h.queue = nil
		}
		if z := h.zones[zone]; z != nil {
			z.busy = true
		}
		// Another worker may wake for the rest.
		if len(h.queue) > 0 {
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
		return zone, true
	}
	return "", false
}

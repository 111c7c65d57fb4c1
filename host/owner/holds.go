// Package owner holds resources back from a zone until their owners are there: before a push,
// the global asks an OwnerCheck policy (batched, one call per push to a zone) which resources the
// zone would reject for a missing owner, and keeps those out of that zone's view until it ACKs
// the owner. With the policy down, it fails open: everything is sent and retries cover the rest.
//
// Plan is the decision, pure: a zone's inventory, the candidates and the previous verdicts in,
// the new verdicts and what became visible out. Holds drives it for every connected zone, and
// `kds-host check` asks it about a file.
package owner

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/shrink"
	"github.com/kds-host/kds-host/shared"
)

// Source is what Holds reads: the snapshot being served.
type Source interface {
	Snapshot() *kds.Snapshot
}

// Inventory is what each zone has ACKed.
type Inventory interface {
	Versions(zone string) map[string]map[string]string
	Connected() []string
}

// Refresher re-evaluates a zone's watches after its view changed, for the named entries (kind ->
// xDS names) that became visible (kds.Cache.Refresh).
type Refresher interface {
	Refresh(zone string, names map[string][]string)
}

// Hooks report decisions, for metrics. Any may be nil.
type Hooks struct {
	Call     func(zone string, candidates int, latency time.Duration, err error)
	FailOpen func(zone string, err error)
}

// Config is what Holds needs.
type Config struct {
	// Policy returns the OwnerCheck in force (a plugin, or the built-in one).
	Policy    func() shared.OwnerCheck
	Timeout   time.Duration // deadline of one Predict call (default 1s)
	Source    Source
	Inventory Inventory
	Refresher Refresher
	Hooks     Hooks
}

// Holds is the kds.Filter that keeps a zone's view to what its owners allow, and the observer
// that re-checks a zone when what it holds changes. A resource version not checked yet for a
// zone is not visible to it: nothing reaches a zone unchecked, except when the policy fails, and
// then everything does.
type Holds struct {
	cfg Config

	mu    sync.RWMutex
	zones map[string]*zoneHolds
	peak  shrink.Peak // of zones
	dirty map[string]bool
	wake  chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

// zoneHolds is what Holds keeps for one zone: while it is connected, and after its last stream
// closed until Forget (the zone's grace period), so that a zone back soon is not checked from
// scratch.
type zoneHolds struct {
	stream   int64
	open     bool
	verdicts Verdicts
	waiting  int // verdicts that WAIT for an owner
}

// New starts the worker that checks dirty zones; Close stops it.
func New(cfg Config) (*Holds, error) {
	if cfg.Policy == nil || cfg.Source == nil || cfg.Inventory == nil || cfg.Refresher == nil {
		return nil, errors.New("owner: Policy, Source, Inventory and Refresher are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Holds{cfg: cfg, zones: map[string]*zoneHolds{}, dirty: map[string]bool{},
		wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go h.run(ctx)
	return h, nil
}

// Close stops the worker.
func (h *Holds) Close() {
	h.cancel()
	<-h.done
}

// Visible implements kds.Filter.
func (h *Holds) Visible(zone string, e *kds.Entry) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	z := h.zones[zone]
	if z == nil {
		return false
	}
	v, ok := z.verdicts[e.Key]
	return ok && v.Accept && v.Version == e.Version
}

// Changed marks every connected zone for a check: the snapshot changed.
func (h *Holds) Changed() {
	h.mark(h.cfg.Inventory.Connected()...)
}

func (h *Holds) mark(zones ...string) {
	if len(zones) == 0 {
		return
	}
	h.mu.Lock()
	for _, z := range zones {
		h.dirty[z] = true
	}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Observer is how Holds hears of stream events: a new stream is checked, an ACK (or the stored
// part of a NACK) may bring an owner that something waits for, and a closed stream's verdicts
// are freed.
func (h *Holds) Observer() event.Observer {
	return event.Observer{
		StreamOpened: func(id int64, zone string) {
			h.mu.Lock()
			if z := h.zones[zone]; z != nil {
				z.stream, z.open = id, true // back within its grace: its verdicts still hold
			} else {
				h.zones[zone] = &zoneHolds{stream: id, open: true}
			}
			h.mu.Unlock()
			h.mark(zone)
		},
		ACK: func(a event.ACK) {
			if h.waiting(a.Zone) {
				h.mark(a.Zone)
			}
		},
		NACK: func(n event.NACK) {
			if len(n.Accepted) > 0 && h.waiting(n.Zone) {
				h.mark(n.Zone)
			}
		},
		StreamClosed: func(id int64, zone string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if z := h.zones[zone]; z != nil && z.stream == id {
				z.open = false
				delete(h.dirty, zone)
			}
		},
	}
}

// waiting reports whether something waits for an owner on the zone.
func (h *Holds) waiting(zone string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	z := h.zones[zone]
	return z != nil && z.waiting > 0
}

func (h *Holds) run(ctx context.Context) {
	defer close(h.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		}
		for {
			h.mu.Lock()
			var zone string
			for z := range h.dirty {
				zone = z
				break
			}
			delete(h.dirty, zone)
			if len(h.dirty) == 0 {
				h.dirty = map[string]bool{} // a burst of marks leaves no buckets behind
			}
			h.mu.Unlock()
			if zone == "" || ctx.Err() != nil {
				break
			}
			h.check(ctx, zone)
		}
	}
}

// check asks the policy once about every resource the zone does not hold at its current
// version, records the verdicts, and refreshes the zone's view where an entry became visible.
func (h *Holds) check(ctx context.Context, zone string) {
	h.mu.RLock()
	z := h.zones[zone]
	open := z != nil && z.open
	h.mu.RUnlock()
	if !open {
		return // the zone left
	}
	plan := NewPlan(zone, h.cfg.Source.Snapshot(), h.cfg.Inventory.Versions(zone), nil)
	var d Decision
	if plan.Asks() {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
		resp, err := h.cfg.Policy().Predict(pctx, plan.Request)
		cancel()
		if ctx.Err() != nil {
			return
		}
		d = plan.Decide(z.verdicts, resp, err) // check is the only writer of verdicts
		if h.cfg.Hooks.Call != nil {
			h.cfg.Hooks.Call(zone, len(plan.Request.Candidates), time.Since(start), d.Err)
		}
		if d.Err != nil && h.cfg.Hooks.FailOpen != nil {
			h.cfg.Hooks.FailOpen(zone, d.Err)
		}
	} else {
		d = plan.Decide(z.verdicts, nil, nil)
	}
	waiting := 0
	for _, v := range d.Verdicts {
		if !v.Accept && v.Held.Verdict == Wait {
			waiting++
		}
	}
	h.mu.Lock()
	if h.zones[zone] != z || !z.open {
		h.mu.Unlock()
		return // the zone left meanwhile
	}
	z.verdicts, z.waiting = d.Verdicts, waiting
	h.mu.Unlock()
	if len(d.Shown) > 0 {
		h.cfg.Refresher.Refresh(zone, d.Shown)
	}
}

// Held returns what is held back from a zone, sorted by key.
func (h *Holds) Held(zone string) []Held {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []Held
	if z := h.zones[zone]; z != nil {
		for _, v := range z.verdicts {
			if !v.Accept {
				out = append(out, v.Held)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}

// Forget frees the verdicts of a zone that has no open stream (its grace period is over).
func (h *Holds) Forget(zone string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if z := h.zones[zone]; z != nil && !z.open {
		delete(h.zones, zone)
		h.zones = shrink.Map(h.zones, &h.peak)
	}
}

// Zones returns how many zones Holds keeps verdicts for.
func (h *Holds) Zones() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.zones)
}

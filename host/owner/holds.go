// Package owner holds resources back from a zone until their owners are there: before a push,
// the global asks an OwnerCheck policy (batched, one call per push to a zone) which resources the
// zone would reject for a missing owner, and keeps those out of that zone's view until it ACKs
// the owner. With the policy down, it fails open: everything is sent and retries cover the rest.
//
// Plan is the decision, pure: a zone's inventory, the candidates and the previous verdicts in,
// the new verdicts and what became visible out. Holds drives it for every connected zone, and
// `kds-host check` asks it about a file. Holds costs what changed: a write checks the changed
// entries (and what waits for them), an ACK the entries waiting for what it brought, found by
// index; zones are checked in parallel.
package owner

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/shrink"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	"github.com/kds-host/kds-host/shared"
)

// Source is what Holds reads: the snapshot being served.
type Source interface {
	Snapshot() *kds.Snapshot
}

// Inventory is what each zone has ACKed.
type Inventory interface {
	// HeldVersion is the version of a resource (kind, xDS name) the zone holds.
	HeldVersion(zone, kind, name string) (string, bool)
	// InventoryKeys lists what the zone holds of kinds (nil: everything), and which of extra.
	InventoryKeys(zone string, kinds []string, extra []resource.Key) []resource.Key
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
	// Workers is how many zones are checked at once (default: the cores, at least 2).
	Workers int
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
	snap  *kds.Snapshot
	queue []string        // zones with work, in order
	inQ   map[string]bool // zones in queue or being checked
	wake  chan struct{}

	ownerKinds ownerKinds

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// zoneHolds is what Holds keeps for one zone: while it is connected, and after its last stream
// closed until Forget (the zone's grace period), so that a zone back soon is not checked from
// scratch.
type zoneHolds struct {
	stream   int64
	open     bool
	verdicts Verdicts
	// waiting indexes the WAIT verdicts by the owner they wait for (resource.Key.String()).
	waiting map[string]map[resource.Key]bool
	// work is what the next check looks at: everything, or these keys.
	full bool
	keys map[resource.Key]bool
	busy bool // a worker is checking it
}

// New starts the workers that check zones; Close stops them.
func New(cfg Config) (*Holds, error) {
	if cfg.Policy == nil || cfg.Source == nil || cfg.Inventory == nil || cfg.Refresher == nil {
		return nil, errors.New("owner: Policy, Source, Inventory and Refresher are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = max(2, runtime.GOMAXPROCS(0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Holds{cfg: cfg, zones: map[string]*zoneHolds{}, inQ: map[string]bool{}, wake: make(chan struct{}, 1), cancel: cancel}
	h.ownerKinds.policy = cfg.Policy
	for range cfg.Workers {
		h.wg.Go(func() { h.work(ctx) })
	}
	return h, nil
}

// Close stops the workers.
func (h *Holds) Close() {
	h.cancel()
	h.wg.Wait()
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
	return ok && v.Accepted() && v.Version == e.Version
}

// Changed tells Holds the snapshot served now. When it was derived from the previous one, each
// connected zone checks the changed entries and what waits for them; otherwise everything.
func (h *Holds) Changed(snap *kds.Snapshot) {
	h.mu.Lock()
	changed, delta := snap.ChangesFrom(h.snap)
	h.snap = snap
	var keys []resource.Key
	for kind, names := range changed {
		for _, n := range names {
			keys = append(keys, resource.KeyFromXDSName(kind, n))
		}
	}
	var zones []string
	for name, z := range h.zones {
		if !z.open {
			continue
		}
		if !delta {
			z.full = true
		} else {
			for _, k := range keys {
				z.addWork(k)
				for w := range z.waiting[k.String()] {
					z.addWork(w) // its owner changed
				}
			}
		}
		zones = append(zones, name)
	}
	h.mu.Unlock()
	h.enqueue(zones...)
}

func (z *zoneHolds) addWork(k resource.Key) {
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

// Observer is how Holds hears of stream events: a new stream is checked in full, an ACK (or the
// stored part of a NACK) releases what waited for what it brought, and a closed stream's zone is
// kept until Forget.
func (h *Holds) Observer() event.Observer {
	return event.Observer{
		StreamOpened: func(id int64, zone string) {
			h.mu.Lock()
			z := h.zones[zone]
			if z == nil {
				z = &zoneHolds{waiting: map[string]map[resource.Key]bool{}}
				h.zones[zone] = z
			}
			z.stream, z.open, z.full = id, true, true // back within its grace: its verdicts still hold
			h.mu.Unlock()
			h.enqueue(zone)
		},
		ACK: func(a event.ACK) { h.arrived(a.Zone, a.Kind, a.Versions) },
		NACK: func(n event.NACK) {
			if len(n.Accepted) > 0 {
				h.arrived(n.Zone, n.Kind, n.Accepted)
			}
		},
		StreamClosed: func(id int64, zone string) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if z := h.zones[zone]; z != nil && z.stream == id {
				z.open = false
			}
		},
	}
}

// arrived queues a check of what waits for the resources a zone now holds. It runs on the
// stream's goroutine: one index lookup per name.
func (h *Holds) arrived(zone, kind string, names map[string]string) {
	h.mu.Lock()
	z := h.zones[zone]
	if z == nil || !z.open || len(z.waiting) == 0 {
		h.mu.Unlock()
		return
	}
	found := false
	for n := range names {
		for k := range z.waiting[resource.KeyFromXDSName(kind, n).String()] {
			z.addWork(k)
			found = true
		}
	}
	h.mu.Unlock()
	if found {
		h.enqueue(zone)
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

// check asks the policy once about the zone's pending work (every entry it does not hold at its
// current version, or the changed ones and their owners), records the verdicts, and refreshes the
// zone's view where an entry became visible.
func (h *Holds) check(ctx context.Context, zone string) {
	h.mu.Lock()
	z := h.zones[zone]
	if z == nil || !z.open {
		h.mu.Unlock()
		return // the zone left
	}
	snap, full, keys := h.snap, z.full, z.keys
	z.full, z.keys = false, nil
	prev := z.verdicts
	h.mu.Unlock()
	if snap == nil {
		snap = h.cfg.Source.Snapshot()
	}

	if !full && 2*len(keys) >= snap.Len() {
		full = true // most of the snapshot (a Mesh ACK releasing what waited): one walk, one map
	}
	entries, gone := h.entriesFor(zone, snap, full, keys)
	plan := NewPlanOf(zone, entries, func(kind, name string) (string, bool) { return h.cfg.Inventory.HeldVersion(zone, kind, name) })
	var d Decision
	if plan.Asks() {
		kinds, extra := h.ownerKinds.get(ctx), []resource.Key(nil)
		if kinds != nil {
			for _, e := range entries {
				extra = append(extra, explicitOwners(e)...)
			}
		}
		for _, k := range h.cfg.Inventory.InventoryKeys(zone, kinds, extra) {
			plan.Request.Inventory = append(plan.Request.Inventory, &kdsv1.ResourceKey{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name})
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
		resp, err := h.cfg.Policy().Predict(pctx, plan.Request)
		cancel()
		if ctx.Err() != nil {
			return
		}
		d = plan.Decide(prev, resp, err)
		if h.cfg.Hooks.Call != nil {
			h.cfg.Hooks.Call(zone, len(plan.Request.Candidates), time.Since(start), d.Err)
		}
		if d.Err != nil && h.cfg.Hooks.FailOpen != nil {
			h.cfg.Hooks.FailOpen(zone, d.Err)
		}
	} else {
		d = plan.Decide(prev, nil, nil)
	}

	h.mu.Lock()
	if h.zones[zone] != z || !z.open {
		h.mu.Unlock()
		return // the zone left meanwhile
	}
	if full {
		// The decision covers every entry: it becomes the zone's verdicts as it is.
		z.verdicts = d.Verdicts
		clear(z.waiting)
		for k, v := range z.verdicts {
			z.index(k, v)
		}
	} else {
		if z.verdicts == nil {
			z.verdicts = make(Verdicts, len(d.Verdicts))
		}
		for _, k := range gone {
			z.setVerdict(k, Verdict{}, false)
		}
		for k, v := range d.Verdicts {
			z.setVerdict(k, v, true)
		}
	}
	h.mu.Unlock()
	if len(d.Shown) > 0 {
		h.cfg.Refresher.Refresh(zone, d.Shown)
	}
}

// setVerdict records (or, when !ok, drops) the verdict of k and keeps the waiting index.
func (z *zoneHolds) setVerdict(k resource.Key, v Verdict, ok bool) {
	if old, had := z.verdicts[k]; had && old.Held != nil && old.Held.WaitingFor != "" {
		if w := z.waiting[old.Held.WaitingFor]; w != nil {
			delete(w, k)
			if len(w) == 0 {
				delete(z.waiting, old.Held.WaitingFor)
			}
		}
	}
	if !ok {
		delete(z.verdicts, k)
		return
	}
	z.verdicts[k] = v
	z.index(k, v)
}

// index adds a WAIT verdict to the waiting index.
func (z *zoneHolds) index(k resource.Key, v Verdict) {
	if v.Held != nil && v.Held.Verdict == Wait && v.Held.WaitingFor != "" {
		w := z.waiting[v.Held.WaitingFor]
		if w == nil {
			w = map[resource.Key]bool{}
			z.waiting[v.Held.WaitingFor] = w
		}
		w[k] = true
	}
}

// entriesFor returns the snapshot entries a check looks at: every entry, or the keys asked for
// and, transitively, the owners they name that are served (a candidate's owner is a candidate
// too, so the policy can tell "wait for it" from "it exists nowhere"); and the keys no longer
// served.
func (h *Holds) entriesFor(zone string, snap *kds.Snapshot, full bool, keys map[resource.Key]bool) (entries []*kds.Entry, gone []resource.Key) {
	if full {
		for _, kind := range snap.Kinds() {
			for _, e := range snap.Kind(kind) {
				entries = append(entries, e)
			}
		}
		return entries, nil
	}
	seen := make(map[resource.Key]bool, len(keys))
	queue := make([]resource.Key, 0, len(keys))
	for k := range keys {
		queue = append(queue, k)
	}
	for len(queue) > 0 {
		k := queue[0]
		queue = queue[1:]
		if seen[k] {
			continue
		}
		seen[k] = true
		e, ok := snap.Kind(k.Kind)[k.XDSName()]
		if !ok {
			gone = append(gone, k)
			continue
		}
		entries = append(entries, e)
		for _, o := range owners(e) {
			served, ok := snap.Kind(o.Kind)[o.XDSName()]
			if !ok {
				continue // served nowhere: the policy's to judge (REJECT), not a candidate
			}
			if v, held := h.cfg.Inventory.HeldVersion(zone, o.Kind, o.XDSName()); !held || v != served.Version {
				queue = append(queue, o)
			}
		}
	}
	return entries, gone
}

// owners are the keys a resource names as its owners: its Mesh, when mesh-scoped, and its
// explicit owners.
func owners(e *kds.Entry) []resource.Key {
	var out []resource.Key
	if e.Resource.GetMesh() != "" {
		out = append(out, resource.Key{Kind: resource.MeshKind, Name: e.Resource.GetMesh()})
	}
	return append(out, explicitOwners(e)...)
}

func explicitOwners(e *kds.Entry) []resource.Key {
	var out []resource.Key
	for _, o := range e.Resource.GetOwners() {
		out = append(out, resource.Key{Kind: o.GetKind(), Mesh: o.GetMesh(), Name: o.GetName()})
	}
	return out
}

// ownerKinds is what the policy declared as the kinds that can own (Describe's owner_kinds),
// asked again at most every ownerKindsTTL: a reload may bring another policy.
type ownerKinds struct {
	policy func() shared.OwnerCheck

	mu    sync.Mutex
	kinds []string
	at    time.Time
}

const ownerKindsTTL = 10 * time.Second

// get returns the declared owner kinds, or nil for "send the whole inventory" (nothing
// declared, or Describe failed).
func (o *ownerKinds) get(ctx context.Context) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.at.IsZero() && time.Since(o.at) < ownerKindsTTL {
		return o.kinds
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	d, err := o.policy().Describe(dctx)
	cancel()
	o.kinds, o.at = nil, time.Now()
	if err == nil && len(d.GetOwnerKinds()) > 0 {
		o.kinds = slices.Clone(d.GetOwnerKinds())
	}
	return o.kinds
}

// Held returns what is held back from a zone, sorted by key.
func (h *Holds) Held(zone string) []Held {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []Held
	if z := h.zones[zone]; z != nil {
		for _, v := range z.verdicts {
			if v.Held != nil {
				out = append(out, *v.Held)
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

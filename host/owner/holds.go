// Package owner holds resources back from a zone until their owners are there: before a push,
// the global asks an OwnerCheck policy (batched, one call per push to a zone) which resources the
// zone would reject for a missing owner, and keeps those out of that zone's view until it ACKs
// the owner. With the policy down, it fails open: everything is sent and retries cover the rest.
//
// Plan is the decision, pure: a zone's inventory, the candidates and the previous verdicts in,
// the new verdicts and what became visible out. Holds drives it for every connected zone, and
// `kds-host check` asks it about a file. Holds costs what changed: a write checks the changed
// entries (and what waits for them), an ACK the entries waiting for what it brought, found by
// index; zones are checked in parallel, and zones that hold the same share one answer when the
// policy declares its answers zone independent.
package owner

import (
	"context"
	"errors"
	"hash/maphash"
	"runtime"
	"slices"
	"sort"
	"strings"
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
	// InventoryDigest identifies what the zone holds now: checks of two zones with the same
	// digest at the same snapshot ask the same, and may share one answer.
	InventoryDigest(zone string) kds.Digest
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
	// Generation changes whenever another policy comes into force (a reload). Holds shares one
	// Predict answer between the zones that ask the same only within one generation, one
	// snapshot, and when the policy declares its answers zone_independent; nil shares nothing.
	Generation func() uint64
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

	described described
	shared    map[shareKey]*outcome // answers zones share, for h.snap only

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// zoneHolds is what Holds keeps for one zone: while it is connected, and after its last stream
// closed until Forget (the zone's grace period), so that a zone back soon is not checked from
// scratch.
//
// Its verdicts come in three layers, the first that knows a key wins: own, what the checks of
// some entries (a write, an ACK) decided since the last full check; table, what that full check
// held back; base, the snapshot it checked, whose every other entry is accepted at the version
// it has there. So a zone that may see everything costs nothing per resource, and zones that
// hold the same share one table.
type zoneHolds struct {
	stream int64
	open   bool

	own Verdicts
	// ownWaiting indexes own's WAIT verdicts by the owner they wait for (resource.Key.String()).
	ownWaiting map[string]map[resource.Key]bool
	table      *table
	base       *kds.Snapshot

	// work is what the next check looks at: everything, or these keys.
	full bool
	keys map[resource.Key]bool
	busy bool // a worker is checking it
}

// table is what one full check held back, read-only once made: several zones may point at it.
type table struct {
	held    Verdicts
	waiting map[string][]resource.Key // held's WAIT verdicts, by the owner they wait for
}

func newTable(held Verdicts) *table {
	t := &table{held: held, waiting: map[string][]resource.Key{}}
	for k, v := range held {
		if v.Held.Verdict == Wait && v.Held.WaitingFor != "" {
			t.waiting[v.Held.WaitingFor] = append(t.waiting[v.Held.WaitingFor], k)
		}
	}
	return t
}

// verdict is the zone's verdict of k, if it has one.
func (z *zoneHolds) verdict(k resource.Key, name string) (Verdict, bool) {
	if v, ok := z.own[k]; ok {
		return v, true
	}
	if z.table != nil {
		if v, ok := z.table.held[k]; ok {
			return v, true
		}
	}
	if e := z.base.Kind(k.Kind)[name]; e != nil {
		return Verdict{Version: e.Version}, true
	}
	return Verdict{}, false
}

// VisibleVersion implements View.
func (z *zoneHolds) VisibleVersion(k resource.Key) string {
	v, _ := z.verdict(k, k.XDSName())
	return v.visible()
}

// visibleEntry is VisibleVersion of an entry's key, without building its xDS name.
func (z *zoneHolds) visibleEntry(e *kds.Entry) string {
	v, _ := z.verdict(e.Key, e.Name)
	return v.visible()
}

// addWaiting adds what waits for owner to the next check's work, and reports whether anything
// does. When that is most of the snapshot (snapLen entries; a Mesh ACK releasing what waited
// for it) the next check looks at everything instead: one walk, not a set of every key.
func (z *zoneHolds) addWaiting(owner string, snapLen int) bool {
	var shared []resource.Key
	if z.table != nil {
		shared = z.table.waiting[owner]
	}
	n := len(z.ownWaiting[owner]) + len(shared)
	if n == 0 || z.full {
		return n > 0
	}
	if 2*(len(z.keys)+n) >= snapLen {
		z.full, z.keys = true, nil
		return true
	}
	for k := range z.ownWaiting[owner] {
		z.addWork(k)
	}
	for _, k := range shared {
		z.addWork(k) // a key own decided since is looked at again: harmless
	}
	return true
}

func (z *zoneHolds) waits() bool {
	return len(z.ownWaiting) > 0 || (z.table != nil && len(z.table.waiting) > 0)
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
	h.described.policy, h.described.generation = cfg.Policy, cfg.Generation
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
	visible, _, release := h.View(zone)
	defer release()
	return visible(e)
}

var _ kds.ZoneFilter = (*Holds)(nil)

// View implements kds.ZoneFilter: Visible for one zone, under one read lock until release. A
// zone not checked yet sees nothing.
func (h *Holds) View(zone string) (visible func(*kds.Entry) bool, none bool, release func()) {
	h.mu.RLock()
	z := h.zones[zone]
	none = z == nil || (z.base == nil && z.table == nil && len(z.own) == 0)
	return func(e *kds.Entry) bool {
		if z == nil {
			return false
		}
		v, ok := z.verdict(e.Key, e.Name)
		return ok && v.Accepted() && v.Version == e.Version
	}, none, h.mu.RUnlock
}

// Changed tells Holds the snapshot served now. When it was derived from the previous one, each
// connected zone checks the changed entries and what waits for them; otherwise everything.
func (h *Holds) Changed(snap *kds.Snapshot) {
	h.mu.Lock()
	changed, delta := snap.ChangesFrom(h.snap)
	h.snap = snap
	h.shared = nil
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
				z.addWaiting(k.String(), snap.Len()) // its owner changed
			}
		}
		zones = append(zones, name)
	}
	h.mu.Unlock()
	h.enqueue(zones...)
}

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

// Observer is how Holds hears of stream events: a new stream is checked in full, an ACK (or the
// stored part of a NACK) releases what waited for what it brought, and a closed stream's zone is
// kept until Forget.
func (h *Holds) Observer() event.Observer {
	return event.Observer{
		StreamOpened: func(id int64, zone string) {
			h.mu.Lock()
			z := h.zones[zone]
			if z == nil {
				z = &zoneHolds{}
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
	if z == nil || !z.open || !z.waits() {
		h.mu.Unlock()
		return
	}
	found := false
	for n := range names {
		if z.addWaiting(resource.KeyFromXDSName(kind, n).String(), h.snap.Len()) {
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
	h.mu.Unlock()
	if snap == nil {
		snap = h.cfg.Source.Snapshot()
	}
	if !full && 2*len(keys) >= snap.Len() {
		full = true // most of the snapshot (a Mesh ACK releasing what waited): one walk, one table
	}

	o := h.decision(ctx, zone, snap, full, keys)
	if o == nil {
		return // stopped
	}

	// Only this worker changes z's verdicts (z.busy), so it reads them without the lock.
	shown := o.shownTo(z)
	h.mu.Lock()
	if h.zones[zone] != z || !z.open {
		h.mu.Unlock()
		return // the zone left meanwhile
	}
	if full {
		// The decision covers every entry of snap: the zone's verdicts are snap and what it held.
		z.base, z.table, z.own, z.ownWaiting = snap, o.table, nil, nil
	} else {
		if z.own == nil {
			z.own, z.ownWaiting = Verdicts{}, map[string]map[resource.Key]bool{}
		}
		for _, k := range o.gone {
			z.setOwn(k, Verdict{}) // no version: never visible until checked again
		}
		for _, e := range o.d.Accepted {
			z.setOwn(e.Key, Verdict{Version: e.Version})
		}
		for k, v := range o.d.Held {
			z.setOwn(k, v)
		}
	}
	h.mu.Unlock()
	if len(shown) > 0 {
		h.cfg.Refresher.Refresh(zone, shown)
	}
}

// outcome is one check's decision, which every zone that asked the same may use.
type outcome struct {
	ready chan struct{} // closed when d is there (shared outcomes)
	d     Decision
	gone  []resource.Key // keys asked about that are no longer served
	table *table         // d.Held as a table (full checks)

	mu    sync.Mutex
	shown map[view]map[string][]string // what d shows to each view it was shared with
}

// view is a zone's verdicts when it has no own ones: zones that share one see the same.
type view struct {
	table *table
	base  *kds.Snapshot
}

// shownTo is what the decision makes visible to z (Decision.Shown), computed once for the zones
// that shared the decision from the same view. The answer is read-only.
func (o *outcome) shownTo(z *zoneHolds) map[string][]string {
	if o.ready == nil || len(z.own) > 0 {
		return shown(o.d.Accepted, z)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	v := view{z.table, z.base}
	if s, ok := o.shown[v]; ok {
		return s
	}
	s := shown(o.d.Accepted, z)
	if o.shown == nil {
		o.shown = map[view]map[string][]string{}
	}
	o.shown[v] = s
	return s
}

// shareKey is what makes two zones' checks ask the same.
type shareKey struct {
	snap       *kds.Snapshot
	generation uint64
	inventory  kds.Digest
	full       bool
	keys       uint64 // the keys a partial check looks at
	ownerKinds string
}

// decision decides a check of zone: the zone's own, or one shared with the zones that asked the
// same before (or are asking now). It returns nil when ctx is done.
func (h *Holds) decision(ctx context.Context, zone string, snap *kds.Snapshot, full bool, keys map[resource.Key]bool) *outcome {
	decl := h.described.get(ctx)
	kinds := decl.kinds
	if !decl.shared {
		return h.decide(ctx, zone, snap, full, keys, kinds)
	}
	key := shareKey{snap: snap, generation: decl.generation, inventory: h.cfg.Inventory.InventoryDigest(zone), full: full, ownerKinds: strings.Join(kinds, ",")}
	if !full {
		key.keys = keysHash(keys)
	}
	for {
		h.mu.Lock()
		o, found := h.shared[key]
		if !found && h.snap == snap {
			o = &outcome{ready: make(chan struct{})}
			if h.shared == nil || len(h.shared) >= maxShared {
				h.shared = map[shareKey]*outcome{}
			}
			h.shared[key] = o
		}
		h.mu.Unlock()
		if o == nil {
			// The snapshot moved on: this check is stale, and its zone has new work queued.
			return h.decide(ctx, zone, snap, full, keys, kinds)
		}
		if found {
			select {
			case <-o.ready:
			case <-ctx.Done():
				return nil
			}
			if o.d.Err == nil {
				return o
			}
			continue // that check failed open: ask again
		}
		mine := h.decide(ctx, zone, snap, full, keys, kinds)
		moved := h.cfg.Inventory.InventoryDigest(zone) != key.inventory
		h.mu.Lock()
		if mine == nil || mine.d.Err != nil || moved {
			// Not an answer to share: stopped, failed open, or the inventory moved while the
			// check read it.
			if h.shared[key] == o {
				delete(h.shared, key)
			}
			o.d.Err = errors.New("not shared")
		} else {
			o.d, o.gone, o.table = mine.d, mine.gone, mine.table
		}
		h.mu.Unlock()
		close(o.ready)
		return mine
	}
}

// maxShared bounds the answers kept for sharing (each a set of zones that hold the same).
const maxShared = 256

// decide runs one check of zone against snap: plan, Predict, decision (and the hooks). It
// returns nil when ctx is done.
func (h *Holds) decide(ctx context.Context, zone string, snap *kds.Snapshot, full bool, keys map[resource.Key]bool, kinds []string) *outcome {
	entries, gone := h.entriesFor(zone, snap, full, keys)
	plan := NewPlanOf(zone, entries, func(kind, name string) (string, bool) { return h.cfg.Inventory.HeldVersion(zone, kind, name) })
	o := &outcome{gone: gone}
	if plan.Asks() {
		var extra []resource.Key
		if kinds != nil {
			for _, e := range plan.entries {
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
			return nil
		}
		o.d = plan.decide(resp, err)
		if h.cfg.Hooks.Call != nil {
			h.cfg.Hooks.Call(zone, len(plan.Request.Candidates), time.Since(start), o.d.Err)
		}
		if o.d.Err != nil && h.cfg.Hooks.FailOpen != nil {
			h.cfg.Hooks.FailOpen(zone, o.d.Err)
		}
	} else {
		o.d = plan.decide(nil, nil)
	}
	if full {
		o.table = newTable(o.d.Held)
	}
	return o
}

// keysHash identifies a set of keys, whatever their order.
func keysHash(keys map[resource.Key]bool) uint64 {
	var sum uint64
	for k := range keys {
		var h maphash.Hash
		h.SetSeed(keysSeed)
		h.WriteString(k.Kind)
		h.WriteByte(0)
		h.WriteString(k.Mesh)
		h.WriteByte(0)
		h.WriteString(k.Name)
		sum ^= h.Sum64()
	}
	return sum ^ uint64(len(keys))
}

var keysSeed = maphash.MakeSeed()

// setOwn records the verdict of k in own (a verdict without version: k is no longer served) and
// keeps own's waiting index.
func (z *zoneHolds) setOwn(k resource.Key, v Verdict) {
	if old, had := z.own[k]; had && old.Held != nil && old.Held.WaitingFor != "" {
		if w := z.ownWaiting[old.Held.WaitingFor]; w != nil {
			delete(w, k)
			if len(w) == 0 {
				delete(z.ownWaiting, old.Held.WaitingFor)
			}
		}
	}
	z.own[k] = v
	if v.Held != nil && v.Held.Verdict == Wait && v.Held.WaitingFor != "" {
		w := z.ownWaiting[v.Held.WaitingFor]
		if w == nil {
			w = map[resource.Key]bool{}
			z.ownWaiting[v.Held.WaitingFor] = w
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

// described is what the policy in force declared in Describe, asked again at most every
// describeTTL, and at once when its generation changes (a reload brings another policy).
type described struct {
	policy     func() shared.OwnerCheck
	generation func() uint64 // nil: unknown, so answers are never shared

	mu   sync.Mutex
	decl declaration
	at   time.Time
}

// declaration is one Describe answer, as Holds uses it.
type declaration struct {
	kinds      []string // owner_kinds; nil: send the whole inventory (nothing declared, or Describe failed)
	shared     bool     // answers may be shared between zones: zone_independent, in a known generation
	generation uint64   // the generation the answer came from
}

const describeTTL = 10 * time.Second

func (o *described) get(ctx context.Context) declaration {
	o.mu.Lock()
	defer o.mu.Unlock()
	var gen uint64
	if o.generation != nil {
		gen = o.generation()
	}
	if !o.at.IsZero() && time.Since(o.at) < describeTTL && gen == o.decl.generation {
		return o.decl
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	d, err := o.policy().Describe(dctx)
	cancel()
	o.decl, o.at = declaration{generation: gen, shared: err == nil && d.GetZoneIndependent() && o.generation != nil}, time.Now()
	if err == nil && len(d.GetOwnerKinds()) > 0 {
		o.decl.kinds = slices.Clone(d.GetOwnerKinds())
	}
	return o.decl
}

// Held returns what is held back from a zone, sorted by key.
func (h *Holds) Held(zone string) []Held {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []Held
	if z := h.zones[zone]; z != nil {
		for _, v := range z.own {
			if v.Held != nil {
				out = append(out, *v.Held)
			}
		}
		if z.table != nil {
			for k, v := range z.table.held {
				if _, over := z.own[k]; !over {
					out = append(out, *v.Held)
				}
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

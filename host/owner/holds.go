// Package owner holds resources back from a zone until their owners are there: before a push,
// the global asks an OwnerCheck policy (batched, one call per push to a zone) which resources the
// zone would reject for a missing owner, and keeps those out of that zone's view until it ACKs
// the owner. With the policy down, it fails open: everything is sent and retries cover the rest.
package owner

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Source is what Holds reads: the snapshot being served and what each zone holds.
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

// Held is one resource kept out of a zone's view.
type Held struct {
	Key        resource.Key `json:"key"`
	Verdict    string       `json:"verdict"` // WAIT or REJECT
	WaitingFor string       `json:"waitingFor,omitempty"`
	Reason     string       `json:"reason,omitempty"`
}

// verdict is the decision for one version of one resource on one zone.
type verdict struct {
	version string
	accept  bool
	held    Held
}

// visible is the version of the resource the zone may see, or "" for none.
func (v verdict) visible() string {
	if !v.accept {
		return ""
	}
	return v.version
}

// Holds is the kds.Filter that keeps a zone's view to what its owners allow, and the
// kds.Observer that re-checks a zone when what it holds changes. A resource version not checked
// yet for a zone is not visible to it: nothing reaches a zone unchecked, except when the policy
// fails, and then everything does.
type Holds struct {
	cfg Config

	mu       sync.RWMutex
	verdicts map[string]map[resource.Key]verdict // zone -> key -> decision
	dirty    map[string]bool
	wake     chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
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
	h := &Holds{cfg: cfg, verdicts: map[string]map[resource.Key]verdict{}, dirty: map[string]bool{},
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
	v, ok := h.verdicts[zone][e.Key]
	return ok && v.accept && v.version == e.Version
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

// StreamOpened implements kds.Observer.
func (h *Holds) StreamOpened(_ int64, zone string) { h.mark(zone) }

// StreamClosed implements kds.Observer.
func (h *Holds) StreamClosed(int64, string) {}

// Sent implements kds.Observer.
func (h *Holds) Sent(int64, string, string, map[string]string, []string) {}

// Nacked implements kds.Observer: what the zone stored of a partly refused response may be an
// owner something waits for.
func (h *Holds) Nacked(n kds.NACK) {
	if len(n.Accepted) > 0 && h.waiting(n.Zone) {
		h.mark(n.Zone)
	}
}

// Acked implements kds.Observer: an ACK may bring an owner that something waits for.
func (h *Holds) Acked(a kds.ACK) {
	if h.waiting(a.Zone) {
		h.mark(a.Zone)
	}
}

func (h *Holds) waiting(zone string) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, v := range h.verdicts[zone] {
		if !v.accept && v.held.Verdict == "WAIT" {
			return true
		}
	}
	return false
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
// An entry hidden now that was visible before needs no refresh: a hidden entry never makes a
// response (the zone keeps what it has).
func (h *Holds) check(ctx context.Context, zone string) {
	snap := h.cfg.Source.Snapshot()
	held := h.cfg.Inventory.Versions(zone)
	h.mu.RLock()
	prev := h.verdicts[zone] // check is the only writer
	h.mu.RUnlock()
	shown := map[string][]string{} // kind -> xDS names visible now at a version not visible before
	show := func(e *kds.Entry) {
		if prev[e.Key].visible() != e.Version {
			shown[e.Key.Kind] = append(shown[e.Key.Kind], e.Key.XDSName())
		}
	}
	var entries []*kds.Entry
	var candidates []*kdsv1.Resource
	var inventory []*kdsv1.ResourceKey
	for kind, names := range held {
		for name := range names {
			k := resource.KeyFromXDSName(kind, name)
			inventory = append(inventory, &kdsv1.ResourceKey{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name})
		}
	}
	next := make(map[resource.Key]verdict, snap.Len())
	for _, kind := range snap.Kinds() {
		for name, e := range snap.Kind(kind) {
			if held[kind][name] == e.Version {
				next[e.Key] = verdict{version: e.Version, accept: true} // already there
				show(e)
				continue
			}
			entries = append(entries, e)
			candidates = append(candidates, e.Resource)
		}
	}
	if len(candidates) > 0 {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
		resp, err := h.cfg.Policy().Predict(pctx, &pluginv1.PredictRequest{Zone: zone, Candidates: candidates, Inventory: inventory})
		cancel()
		if err == nil && len(resp.GetPredictions()) != len(candidates) {
			err = errors.New("owner check answered a different number of predictions")
		}
		if h.cfg.Hooks.Call != nil {
			h.cfg.Hooks.Call(zone, len(candidates), time.Since(start), err)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil && h.cfg.Hooks.FailOpen != nil {
			h.cfg.Hooks.FailOpen(zone, err)
		}
		for i, e := range entries {
			v := verdict{version: e.Version, accept: true}
			if err == nil {
				p := resp.GetPredictions()[i]
				switch p.GetVerdict() {
				case pluginv1.Verdict_VERDICT_WAIT:
					v = verdict{version: e.Version, held: Held{Key: e.Key, Verdict: "WAIT", WaitingFor: keyString(p.GetWaitingFor()), Reason: p.GetReason()}}
				case pluginv1.Verdict_VERDICT_REJECT:
					v = verdict{version: e.Version, held: Held{Key: e.Key, Verdict: "REJECT", Reason: p.GetReason()}}
				}
			}
			next[e.Key] = v
			if v.accept {
				show(e)
			}
		}
	}
	h.mu.Lock()
	h.verdicts[zone] = next
	h.mu.Unlock()
	if len(shown) > 0 {
		h.cfg.Refresher.Refresh(zone, shown)
	}
}

func keyString(k *kdsv1.ResourceKey) string {
	if k == nil {
		return ""
	}
	return resource.Key{Kind: k.GetKind(), Mesh: k.GetMesh(), Name: k.GetName()}.String()
}

// Held returns what is held back from a zone, sorted by key.
func (h *Holds) Held(zone string) []Held {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var out []Held
	for _, v := range h.verdicts[zone] {
		if !v.accept {
			out = append(out, v.held)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}

package owner_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// The model test drives Holds with random writes, ACKs, NACKs, reconnects and reloads over a
// small universe, and after each step, once the workers are idle, compares what Holds lets each
// connected zone see with a decision made from scratch: NewPlan over the zone's whole inventory
// and the current snapshot, with no previous verdicts, answered by the reference policy.

var (
	modelMeshes = []string{"m1", "m2"}
	modelKinds  = []string{"MeshTimeout", "MeshRetry"}
	modelNames  = []string{"a", "b", "c"}
	modelZones  = []string{"zone-1", "zone-2", "zone-3"}
)

// modelStream is a zone's stream, as the model knows it.
type modelStream struct {
	id   int64
	open bool
}

// inventoryOf is a copy of what zone holds.
func (w *world) inventoryOf(zone string) map[string]map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]map[string]string{}
	for kind, names := range w.inventory[zone] {
		out[kind] = maps.Clone(names)
	}
	return out
}

// store records that zone holds versions of kind (by name) and no longer removed, as engine.Zones
// does before the observers hear of the ACK.
func (w *world) store(zone, kind string, versions map[string]string, removed []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	held := w.inventory[zone]
	if held[kind] == nil {
		held[kind] = map[string]string{}
	}
	maps.Copy(held[kind], versions)
	for _, n := range removed {
		delete(held[kind], n)
	}
}

// empty forgets what zone holds, as engine.Zones does when a stream opens.
func (w *world) empty(zone string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inventory[zone] = map[string]map[string]string{}
}

func (w *world) serve(snap *engine.Snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.snap = snap
}

// declaringNothing is the reference policy as a plugin of the older contract: it declares no
// owner kinds and nothing about zones, so it gets the whole inventory and shares no answer.
type declaringNothing struct{ *ownerpredict.Predictor }

func (d declaringNothing) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	r, err := d.Predictor.Describe(ctx)
	if r != nil {
		r.OwnerKinds, r.ZoneIndependent = nil, false
	}
	return r, err
}

// modelRun is one seeded run of the model.
type modelRun struct {
	t       *testing.T
	rnd     *rand.Rand
	global  *world
	zones   map[string]*modelStream
	builder kds.SnapshotBuilder
	store   map[resource.Key]resource.Resource // what the global stores
	holds   *owner.Holds
	obs     event.Observer
	policy  atomic.Pointer[shared.OwnerCheck]
	gate    gate
	gen     atomic.Uint64
	streams int64
	log     []string // the steps so far, for a failure
	seesAll int      // checks that found a zone's view seeing all of the snapshot
}

func TestHoldsAgreeWithADecisionFromScratch(t *testing.T) {
	seesAll := 0
	for seed := range uint64(10) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { seesAll += runModel(t, seed, 500) })
		})
	}
	if seesAll == 0 {
		t.Error("no check found a view that sees all of the snapshot: SeesAll is never tried")
	}
}

// runModel runs the model for steps steps, and returns how many checks found a zone's view that
// sees all of the snapshot.
func runModel(t *testing.T, seed uint64, steps int) int {
	r := &modelRun{
		t: t, rnd: rand.New(rand.NewPCG(seed, 0x6f776e6572)), store: map[resource.Key]resource.Resource{},
		global: &world{inventory: map[string]map[string]map[string]string{}, refreshed: map[string][]string{}},
		zones:  map[string]*modelStream{},
	}
	for _, z := range modelZones {
		r.global.inventory[z], r.zones[z] = map[string]map[string]string{}, &modelStream{}
	}
	var p shared.OwnerCheck = ownerpredict.New()
	r.policy.Store(&p)
	holds, err := owner.New(owner.Config{Mapping: owner.KDSMapping,
		Policy: func() shared.OwnerCheck { return gated{*r.policy.Load(), &r.gate} }, Source: r.global, Inventory: r.global, Refresher: r.global,
		Workers: 2, Generation: r.gen.Load, Timeout: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer holds.Close()
	r.holds, r.obs = holds, holds.Observer()
	r.write()
	for _, z := range modelZones {
		r.connect(z)
	}
	r.check()
	for step := range steps {
		switch shut := r.gate.isShut(); {
		case shut && r.rnd.IntN(3) == 0:
			r.logf("the policy answers")
			r.gate.open()
			r.check()
			continue
		case !shut && r.rnd.IntN(20) == 0:
			r.logf("the policy stops answering")
			r.gate.shut()
		}
		switch n := r.rnd.IntN(100); {
		case n < 30:
			r.write()
		case n < 60:
			r.ack(false)
		case n < 72:
			r.ack(true)
		case n < 82:
			r.reconnect()
		case n < 86:
			r.leave()
		case n < 93:
			r.reload()
		default:
			r.logf("%d s pass", describeAfter/time.Second)
			time.Sleep(describeAfter)
		}
		if r.rnd.IntN(4) == 0 || r.gate.isShut() {
			continue // the next step comes before the checks of this one are done
		}
		r.check()
		if t.Failed() {
			t.Fatalf("seed %d, after step %d:\n%s", seed, step, strings.Join(r.log[max(0, len(r.log)-25):], "\n"))
		}
	}
	return r.seesAll
}

// describeAfter is more than Holds keeps a Describe answer.
const describeAfter = 11 * time.Second

func (r *modelRun) logf(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

// write creates, updates or deletes one to three resources, and tells Holds the new snapshot.
func (r *modelRun) write() {
	var changed []resource.Resource
	var deleted []resource.Key
	for range 1 + r.rnd.IntN(3) {
		k := r.randomKey()
		old, exists := r.store[k]
		switch {
		case exists && r.rnd.IntN(3) == 0:
			delete(r.store, k)
			deleted = append(deleted, k)
			r.logf("delete %s", k)
		default:
			res := resource.Resource{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name, Generation: old.Generation + 1}
			if k.Kind != resource.MeshKind && r.rnd.IntN(2) == 0 {
				res.Owners = []resource.Key{r.randomKey()}
				if res.Owners[0] == k {
					res.Owners = nil
				}
			}
			r.store[k] = res
			changed = append(changed, res)
			r.logf("write %s (generation %d, owners %v)", k, res.Generation, res.Owners)
		}
	}
	snap, err := r.builder.Update(changed, deleted)
	if err != nil {
		r.t.Fatal(err)
	}
	// As guard.Cache serves a snapshot: Prepare, the cache, then Changed. A shut gate would hold
	// Prepare's Predict call until its deadline, which fails open and prepares nothing: the same
	// as not calling it.
	if !r.gate.isShut() {
		r.holds.Prepare(snap)
	}
	r.global.serve(snap)
	r.holds.Changed(snap)
}

func (r *modelRun) randomKey() resource.Key {
	if r.rnd.IntN(4) == 0 {
		return resource.Key{Kind: resource.MeshKind, Name: modelMeshes[r.rnd.IntN(len(modelMeshes))]}
	}
	return resource.Key{
		Kind: modelKinds[r.rnd.IntN(len(modelKinds))],
		Mesh: modelMeshes[r.rnd.IntN(len(modelMeshes))],
		Name: modelNames[r.rnd.IntN(len(modelNames))],
	}
}

// openZone picks a connected zone, if any.
func (r *modelRun) openZone() (string, *modelStream, bool) {
	var open []string
	for _, z := range modelZones {
		if r.zones[z].open {
			open = append(open, z)
		}
	}
	if len(open) == 0 {
		return "", nil, false
	}
	z := open[r.rnd.IntN(len(open))]
	return z, r.zones[z], true
}

// ack is a zone's answer to the response of one kind it would get now: what Holds lets it see
// at a version it does not hold, and the removal of what the snapshot no longer serves. An ACK
// stores it all; a NACK stores some of it.
func (r *modelRun) ack(nack bool) {
	zone, z, ok := r.openZone()
	if !ok {
		return
	}
	kind := append([]string{resource.MeshKind}, modelKinds...)[r.rnd.IntN(1+len(modelKinds))]
	snap := r.global.Snapshot()
	held := r.global.inventoryOf(zone)[kind]
	sent := map[string]string{}
	for _, name := range snap.Names(kind) {
		e := snap.Type(kind)[name]
		if held[name] != e.Version && r.holds.Visible(zone, e) {
			sent[name] = e.Version
		}
	}
	var removed []string
	for name := range held {
		if _, served := snap.Type(kind)[name]; !served {
			removed = append(removed, name)
		}
	}
	sort.Strings(removed)
	if len(sent) == 0 && len(removed) == 0 {
		return
	}
	if !nack {
		r.logf("%s ACKs %s: %v, removed %v", zone, kind, sent, removed)
		r.global.store(zone, kind, sent, removed)
		r.obs.ACK(event.ACK{StreamID: z.id, Node: zone, TypeURL: kind, Versions: event.VersionsOf(sent), Removed: removed})
		return
	}
	accepted := map[string]string{}
	var rejected []event.Rejection
	for _, name := range slices.Sorted(maps.Keys(sent)) {
		if r.rnd.IntN(2) == 0 {
			accepted[name] = sent[name]
		} else {
			rejected = append(rejected, event.Rejection{Name: name, Version: sent[name]})
		}
	}
	r.logf("%s NACKs %s: accepted %v", zone, kind, accepted)
	r.global.store(zone, kind, accepted, nil)
	r.obs.NACK(event.NACK{StreamID: z.id, Node: zone, TypeURL: kind, Accepted: accepted, Rejected: rejected})
}

// connect opens a new stream of zone, which reports some of what it held as initial versions.
func (r *modelRun) connect(zone string) {
	z := r.zones[zone]
	before := r.global.inventoryOf(zone)
	r.streams++
	z.id, z.open = r.streams, true
	r.global.empty(zone)
	r.logf("%s opens stream %d", zone, z.id)
	r.obs.StreamOpened(z.id, zone)
	for _, kind := range slices.Sorted(maps.Keys(before)) {
		if len(before[kind]) == 0 || r.rnd.IntN(3) == 0 {
			continue // not subscribed yet
		}
		r.logf("%s reports %s: %v", zone, kind, before[kind])
		r.global.store(zone, kind, before[kind], nil)
		r.obs.ACK(event.ACK{StreamID: z.id, Node: zone, TypeURL: kind, Versions: event.VersionsOf(before[kind]), Initial: true})
	}
}

// reconnect replaces a zone's stream (the new one opens before the old one's close is heard, or
// after), or brings back a zone that left.
func (r *modelRun) reconnect() {
	zone := modelZones[r.rnd.IntN(len(modelZones))]
	z := r.zones[zone]
	old, wasOpen := z.id, z.open
	if wasOpen && r.rnd.IntN(2) == 0 {
		r.logf("%s closes stream %d", zone, old)
		r.obs.StreamClosed(old, zone)
	}
	r.connect(zone)
	if wasOpen {
		r.obs.StreamClosed(old, zone) // late, or again: changes nothing
	}
}

// leave closes a zone's stream, and sometimes its grace period ends too.
func (r *modelRun) leave() {
	zone, z, ok := r.openZone()
	if !ok {
		return
	}
	z.open = false
	r.obs.StreamClosed(z.id, zone)
	r.logf("%s closes stream %d", zone, z.id)
	if r.rnd.IntN(2) == 0 {
		r.holds.Forget(zone)
		r.logf("%s forgotten", zone)
	}
}

// reload brings another policy into force: the reference one, declaring what it needs or not.
func (r *modelRun) reload() {
	var p shared.OwnerCheck = ownerpredict.New()
	if r.rnd.IntN(2) == 0 {
		p = declaringNothing{ownerpredict.New()}
	}
	r.policy.Store(&p)
	r.gen.Add(1)
	r.logf("reload: %T, generation %d", p, r.gen.Load())
}

// check waits until the workers are idle, and compares what Holds lets each connected zone see
// with a decision from scratch.
func (r *modelRun) check() {
	synctest.Wait()
	snap := r.global.Snapshot()
	for _, zone := range modelZones {
		if !r.zones[zone].open {
			continue
		}
		plan := owner.NewPlan(owner.KDSMapping, zone, snap, r.global.inventoryOf(zone), nil)
		resp, err := ownerpredict.New().Predict(context.Background(), plan.Request)
		if err != nil {
			r.t.Fatal(err)
		}
		want := plan.Decide(nil, resp, nil)
		verdicts := want.Verdicts()
		visible, _, release := r.holds.View(zone)
		// What the zone's session reads: the view Holds published after its last check.
		published := r.global.view(zone)
		// A view that says it sees all of snap is one the cache asks nothing of.
		seesAll := published != nil && published.SeesAll(snap)
		if seesAll {
			r.seesAll++
		}
		for _, kind := range snap.Types() {
			for _, name := range snap.Names(kind) {
				e := snap.Type(kind)[name]
				v := verdicts[engine.Ref{TypeURL: e.TypeURL, Name: e.Name}]
				wantVisible := v.Accepted() && v.Version == e.Version
				if visible(e) != wantVisible {
					r.t.Errorf("%s sees %s %s: %v, from scratch: %v (%+v)", zone, kind, name, visible(e), wantVisible, v.Withheld)
				}
				if seesAll && !wantVisible {
					r.t.Errorf("%s's session sees all of the snapshot, but from scratch not %s %s (%+v)", zone, kind, name, v.Withheld)
				}
				if got := published != nil && published.Visible(e); got != wantVisible {
					r.t.Errorf("%s's session sees %s %s: %v, from scratch: %v (%+v)", zone, kind, name, got, wantVisible, v.Withheld)
				}
			}
		}
		release()
		var wantHeld []owner.Withheld
		for _, v := range want.Withheld {
			wantHeld = append(wantHeld, *v.Withheld)
		}
		sort.Slice(wantHeld, func(i, j int) bool {
			a, b := wantHeld[i].Key, wantHeld[j].Key
			return a.TypeURL < b.TypeURL || (a.TypeURL == b.TypeURL && a.Name < b.Name)
		})
		if got := r.holds.Withheld(zone); !slices.Equal(got, wantHeld) {
			r.t.Errorf("%s held back: %+v, from scratch: %+v", zone, got, wantHeld)
		}
	}
}

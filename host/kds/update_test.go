package kds_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

func sameMap[V any](a, b map[string]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func meshResource(name string) resource.Resource {
	return resource.Resource{Kind: "Mesh", Name: name, Spec: json.RawMessage(`{}`), Generation: 1}
}

// versions returns the snapshot's versions by kind and xDS name.
func versions(s *engine.Snapshot) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, kind := range s.Types() {
		out[kind] = map[string]string{}
		for name, e := range s.Type(kind) {
			out[kind][name] = e.Version
		}
	}
	return out
}

func TestUpdateSharesTheKindsItDoesNotTouch(t *testing.T) {
	g := NewWithT(t)
	var b kds.SnapshotBuilder
	a1 := policy("MeshTimeout", "default", "a", `{"v":1}`)
	s1, err := b.Build([]resource.Resource{meshResource("default"), a1,
		policy("MeshTimeout", "default", "b", `{"v":1}`), policy("MeshRetry", "default", "r", `{}`)})
	g.Expect(err).NotTo(HaveOccurred())
	old := s1.Type("MeshTimeout")["default/a"]

	a2 := a1
	a2.Spec, a2.Generation = json.RawMessage(`{"v":2}`), 2
	s2, err := b.Update([]resource.Resource{a2}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s2).NotTo(BeIdenticalTo(s1))
	g.Expect(s2.Len()).To(Equal(4))
	g.Expect(sameMap(s2.Type("Mesh"), s1.Type("Mesh"))).To(BeTrue(), "untouched kinds are shared")
	g.Expect(sameMap(s2.Type("MeshRetry"), s1.Type("MeshRetry"))).To(BeTrue())
	g.Expect(sameMap(s2.Type("MeshTimeout"), s1.Type("MeshTimeout"))).To(BeFalse(), "a touched kind is copied")
	g.Expect(s1.Type("MeshTimeout")["default/a"]).To(BeIdenticalTo(old), "the previous snapshot is not modified")
	want, err := kds.NewEntry(&a2)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s2.Type("MeshTimeout")["default/a"].Version).To(Equal(want.Version))
	g.Expect(s2.Type("MeshTimeout")["default/a"].Version).NotTo(Equal(old.Version))
	g.Expect(s2.Type("MeshTimeout")["default/b"]).To(BeIdenticalTo(s1.Type("MeshTimeout")["default/b"]), "unchanged entries are reused")

	// Nothing to do: the same snapshot.
	s3, err := b.Update([]resource.Resource{a2}, []resource.Key{{Kind: "MeshRetry", Mesh: "default", Name: "absent"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s3).To(BeIdenticalTo(s2))

	// A kind's last resource deleted: the kind is gone; a new one counts.
	s4, err := b.Update([]resource.Resource{policy("MeshTimeout", "default", "c", `{}`)},
		[]resource.Key{{Kind: "MeshRetry", Mesh: "default", Name: "r"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s4.Types()).To(Equal([]string{"Mesh", "MeshTimeout"}))
	g.Expect(s4.Len()).To(Equal(4))
	g.Expect(sameMap(s4.Type("Mesh"), s1.Type("Mesh"))).To(BeTrue())

	// A resource that cannot be encoded is skipped and listed; the rest of the update applies.
	s5, err := b.Update([]resource.Resource{policy("MeshTimeout", "default", "d", `{}`), policy("MeshTimeout", "default", "bad", `[1]`)}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s5.Type("MeshTimeout")).To(HaveKey("default/d"))
	g.Expect(s5.Type("MeshTimeout")).NotTo(HaveKey("default/bad"))
	g.Expect(b.Unservable()).To(ConsistOf(And(HaveField("Key.Name", "bad"), HaveField("Error", Not(BeEmpty())))))
	// A served resource whose new version cannot be encoded keeps its served version.
	served := s5.Type("MeshTimeout")["default/d"]
	badD := policy("MeshTimeout", "default", "d", `"no"`)
	badD.Generation = 2
	s6, err := b.Update([]resource.Resource{badD}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s6.Type("MeshTimeout")["default/d"]).To(BeIdenticalTo(served))
	g.Expect(b.Unservable()).To(HaveLen(2))
	// Fixed or deleted, it is no longer listed.
	fixed := policy("MeshTimeout", "default", "bad", `{"fixed":true}`)
	fixed.Generation = 2
	s7, err := b.Update([]resource.Resource{fixed}, []resource.Key{{Kind: "MeshTimeout", Mesh: "default", Name: "d"}, {Kind: "MeshTimeout", Mesh: "default", Name: "c"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s7.Type("MeshTimeout")).To(HaveKey("default/bad"))
	g.Expect(b.Unservable()).To(BeEmpty())
	s5, err = b.Update(nil, []resource.Key{{Kind: "MeshTimeout", Mesh: "default", Name: "bad"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s5.Len()).To(Equal(3))

	// A full build skips what it cannot encode, and lists it.
	var withBad kds.SnapshotBuilder
	sb, err := withBad.Build([]resource.Resource{meshResource("default"), policy("MeshTimeout", "default", "bad", `[1]`)})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sb.Len()).To(Equal(1))
	g.Expect(withBad.Unservable()).To(HaveLen(1))

	// The result is what a full build of the same resources gives.
	var full kds.SnapshotBuilder
	sf, err := full.Build([]resource.Resource{meshResource("default"), a2, policy("MeshTimeout", "default", "b", `{"v":1}`)})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(versions(s5)).To(Equal(versions(sf)))
}

// update applies a change to the harness's snapshot through SnapshotBuilder.Update.
func (h *harness) update(changed []resource.Resource, deleted ...resource.Key) {
	h.t.Helper()
	s, err := h.b.Update(changed, deleted)
	if err != nil {
		h.t.Fatal(err)
	}
	h.cache.SetSnapshot(s)
}

func TestAnUpdateSendsWhatChangedAndNothingElse(t *testing.T) {
	g := NewWithT(t)
	kinds := []string{"Mesh", "MeshTimeout", "MeshRetry"}
	h := newHarness(t, kinds)
	h.set([]resource.Resource{meshResource("default"),
		policy("MeshTimeout", "default", "a", `{"v":1}`), policy("MeshTimeout", "default", "b", `{"v":1}`),
		policy("MeshRetry", "default", "r", `{}`)})
	h.subscribe(kinds...)
	for range kinds {
		h.ack(h.recv())
	}
	h.expectQuiet(100 * time.Millisecond)

	a2 := policy("MeshTimeout", "default", "a", `{"v":2}`)
	h.update([]resource.Resource{a2})
	r := h.recv()
	g.Expect(r.TypeUrl).To(Equal("MeshTimeout"))
	g.Expect(r.Resources).To(HaveLen(1))
	g.Expect(r.Resources[0].Name).To(Equal("default/a"))
	g.Expect(r.Resources[0].Version).To(Equal(h.cache.Snapshot().Type("MeshTimeout")["default/a"].Version))
	g.Expect(r.RemovedResources).To(BeEmpty())
	h.ack(r)
	h.expectQuiet(100 * time.Millisecond) // the ACK's watch is in step: nothing more, no other kind

	h.update([]resource.Resource{policy("MeshTimeout", "default", "c", `{}`)}, resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "b"})
	r = h.recv()
	g.Expect(r.Resources).To(HaveLen(1))
	g.Expect(r.Resources[0].Name).To(Equal("default/c"))
	g.Expect(r.RemovedResources).To(Equal([]string{"default/b"}))
	h.ack(r)

	// Two updates, the second while the first is not ACKed yet: after the ACK the second is
	// sent (the watch is no longer in step with the snapshot, so it is evaluated in full).
	h.update([]resource.Resource{policy("MeshTimeout", "default", "a", `{"v":3}`)})
	r = h.recv()
	g.Expect(r.Resources).To(HaveLen(1))
	h.update([]resource.Resource{policy("MeshTimeout", "default", "a", `{"v":4}`)})
	h.expectQuiet(100 * time.Millisecond)
	h.ack(r)
	r = h.recv()
	g.Expect(r.Resources).To(HaveLen(1))
	g.Expect(r.Resources[0].Name).To(Equal("default/a"))
	g.Expect(r.Resources[0].Version).To(Equal(h.cache.Snapshot().Type("MeshTimeout")["default/a"].Version))
	h.ack(r)

	h.update(nil, resource.Key{Kind: "MeshRetry", Mesh: "default", Name: "r"})
	r = h.recv()
	g.Expect(r.TypeUrl).To(Equal("MeshRetry"))
	g.Expect(r.RemovedResources).To(Equal([]string{"default/r"}))
	h.ack(r)
	h.expectQuiet(100 * time.Millisecond)
}

func TestANACKedNameIsResentAfterAnUpdate(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, []string{"MeshTimeout"})
	h.set([]resource.Resource{policy("MeshTimeout", "default", "a", `{"v":1}`)})
	h.subscribe("MeshTimeout")
	h.ack(h.recv())

	h.update([]resource.Resource{policy("MeshTimeout", "default", "a", `{"v":2}`), policy("MeshTimeout", "default", "b", `{}`)})
	r := h.recv()
	g.Expect(r.Resources).To(HaveLen(2))
	h.nack(r, "default/a")
	h.expectQuiet(100 * time.Millisecond) // the NACK's watch is in step: nothing is resent by itself

	h.cache.Resend(1, map[string][]string{"MeshTimeout": {"default/a"}})
	r2 := h.recv()
	g.Expect(r2.Resources).To(HaveLen(1))
	g.Expect(r2.Resources[0].Name).To(Equal("default/a"))
	g.Expect(r2.Resources[0].Version).To(Equal(r.Resources[0].Version))
	h.ack(r2)
	h.expectQuiet(100 * time.Millisecond)
}

// hiding is a view (engine.View) that hides its keys from the zone it is published to; a change
// is a new one, with a later seq.
type hiding struct {
	hidden map[resource.Key]bool
	seq    uint64
}

func (v *hiding) Visible(e *engine.Entry) bool  { return !v.hidden[kds.KeyOf(e)] }
func (v *hiding) None() bool                    { return false }
func (v *hiding) SeesAll(*engine.Snapshot) bool { return false }
func (v *hiding) Seq() uint64                   { return v.seq }

// viewing makes h's cache show each zone only its published view (engine.Cache.UseViews), and
// publishes view() to the zone when its stream opens, every name refreshed: the owner holds'
// part.
func viewing(view func() engine.View) func(h *harness) *engine.Tracker {
	return func(h *harness) *engine.Tracker {
		h.cache.UseViews(true)
		return engine.NewTracker(h.cache, h.zones.Observer(), event.Observer{StreamOpened: func(_ int64, zone string) {
			h.cache.Publish(zone, view())
			snap, names := h.cache.Snapshot(), map[string][]string{}
			for _, kind := range snap.Types() {
				names[kind] = snap.Names(kind)
			}
			h.cache.Refresh(zone, names)
		}})
	}
}

// TestRandomUpdatesLeaveTheZoneWithTheSnapshot drives the cache with random changes through
// Update (now and then a full Build, two changes in a row, a NACK and its forced resend, a
// filter hiding or showing names and its Refresh) while a zone applies and ACKs every response;
// after every step the zone comes to hold the snapshot: every visible entry at its version, no
// name that is not served, and a hidden name as it had it (or not at all).
func TestRandomUpdatesLeaveTheZoneWithTheSnapshot(t *testing.T) {
	kinds := []string{"Mesh", "MeshTimeout", "MeshRetry"}
	var mu sync.Mutex // guards filter, which a stream's opening reads
	filter := &hiding{hidden: map[resource.Key]bool{}, seq: 1}
	h := newHarness(t, kinds, viewing(func() engine.View {
		mu.Lock()
		defer mu.Unlock()
		return filter
	}))
	rnd := rand.New(rand.NewPCG(1, 2))
	stored := map[resource.Key]resource.Resource{{Kind: "Mesh", Name: "default"}: meshResource("default")}
	list := func() []resource.Resource {
		var out []resource.Resource
		for _, r := range stored {
			out = append(out, r)
		}
		return out
	}
	h.set(list())
	h.subscribe(kinds...)

	zone := map[string]map[string]string{}
	take := func(r *discovery.DeltaDiscoveryResponse) {
		if zone[r.TypeUrl] == nil {
			zone[r.TypeUrl] = map[string]string{}
		}
		var rejected []string
		for _, res := range r.Resources {
			if rnd.IntN(10) == 0 {
				rejected = append(rejected, res.Name)
				continue
			}
			zone[r.TypeUrl][res.Name] = res.Version
		}
		for _, n := range r.RemovedResources {
			delete(zone[r.TypeUrl], n)
		}
		if len(zone[r.TypeUrl]) == 0 {
			delete(zone, r.TypeUrl)
		}
		if len(rejected) == 0 {
			h.ack(r)
			return
		}
		h.nack(r, rejected...)
		h.cache.Resend(1, map[string][]string{r.TypeUrl: rejected}) // the retry scheduler's part
	}
	holdsSnapshot := func() bool {
		snap := h.cache.Snapshot()
		for kind, names := range zone {
			for name := range names {
				if _, ok := snap.Type(kind)[name]; !ok {
					return false
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for kind, entries := range versions(snap) {
			for name, v := range entries {
				if !filter.hidden[resource.KeyFromXDSName(kind, name)] && zone[kind][name] != v {
					return false
				}
			}
		}
		return true
	}
	// converge takes responses until the zone holds the snapshot.
	converge := func(step int) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case r := <-h.in:
				take(r)
				continue
			case <-time.After(5 * time.Millisecond):
			case <-deadline:
				mu.Lock()
				hidden := filter.hidden
				mu.Unlock()
				t.Fatalf("step %d: the zone holds %v, the snapshot %v, hidden %v", step, zone, versions(h.cache.Snapshot()), hidden)
			}
			if holdsSnapshot() {
				return
			}
		}
	}
	converge(0)

	for i := range 300 {
		if rnd.IntN(5) == 0 {
			// The view's answer changes for a few names (the owner check's part): a new view is
			// published, and the cache is told which.
			names := map[string][]string{}
			mu.Lock()
			next := &hiding{hidden: maps.Clone(filter.hidden), seq: filter.seq + 1}
			for range 1 + rnd.IntN(3) {
				k := resource.Key{Kind: kinds[1+rnd.IntN(2)], Mesh: "default", Name: fmt.Sprintf("p%d", rnd.IntN(12))}
				next.hidden[k] = !next.hidden[k]
				names[k.Kind] = append(names[k.Kind], k.XDSName())
			}
			filter = next
			mu.Unlock()
			h.cache.Publish("zone-1", next)
			h.cache.Refresh("zone-1", names)
		} else {
			var changed []resource.Resource
			var deleted []resource.Key
			for range 1 + rnd.IntN(3) {
				k := resource.Key{Kind: kinds[1+rnd.IntN(2)], Mesh: "default", Name: fmt.Sprintf("p%d", rnd.IntN(12))}
				if _, ok := stored[k]; ok && rnd.IntN(3) == 0 {
					delete(stored, k)
					deleted = append(deleted, k)
					continue
				}
				r := policy(k.Kind, k.Mesh, k.Name, fmt.Sprintf(`{"i":%d}`, i))
				stored[k] = r
				changed = append(changed, r)
			}
			if rnd.IntN(20) == 0 {
				h.set(list())
			} else {
				h.update(changed, deleted...)
			}
		}
		if rnd.IntN(5) > 0 { // else the next step comes while this one is on its way
			converge(i + 1)
		}
	}
	converge(-1)
}

// counting is a view (engine.View) that shows everything and counts what it is asked, by kind.
type counting struct {
	mu    sync.Mutex
	asked map[string]int
}

func (f *counting) Visible(e *engine.Entry) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[e.TypeURL]++
	return true
}

func (f *counting) None() bool                    { return false }
func (f *counting) SeesAll(*engine.Snapshot) bool { return false }
func (f *counting) Seq() uint64                   { return 1 }

func (f *counting) reset() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.asked
	f.asked = map[string]int{}
	return out
}

// Defect 6: Resend re-evaluated every kind of the stream, under the cache's one lock.
func TestResendLooksOnlyAtTheNamedNames(t *testing.T) {
	g := NewWithT(t)
	kinds := []string{"Mesh", "MeshTimeout", "MeshRetry"}
	filter := &counting{asked: map[string]int{}}
	h := newHarness(t, kinds, viewing(func() engine.View { return filter }))
	rs := []resource.Resource{meshResource("default")}
	for i := range 100 {
		rs = append(rs, policy("MeshTimeout", "default", fmt.Sprintf("t-%d", i), `{}`), policy("MeshRetry", "default", fmt.Sprintf("r-%d", i), `{}`))
	}
	h.set(rs)
	h.subscribe(kinds...)
	for range kinds {
		h.ack(h.recv())
	}
	filter.reset()

	h.cache.Resend(1, map[string][]string{"MeshTimeout": {"default/t-7"}})
	r := h.recv()
	g.Expect(r.TypeUrl).To(Equal("MeshTimeout"))
	g.Expect(r.Resources).To(HaveLen(1))
	g.Expect(filter.reset()).To(Equal(map[string]int{"MeshTimeout": 1}), "one name of one kind looked at")
	h.ack(r)
	h.expectQuiet(100 * time.Millisecond)
}

// An update that names a resource twice (two writes of it in one batch, or a write and a
// delete) lists its name once among the changes: each stream looks at it once, and sends it
// once.
func TestAnUpdateListsEachChangedNameOnce(t *testing.T) {
	g := NewWithT(t)
	var b kds.SnapshotBuilder
	s1, err := b.Build([]resource.Resource{meshResource("default"), policy("MeshTimeout", "default", "a", `{"v":1}`),
		policy("MeshTimeout", "default", "b", `{"v":1}`)})
	g.Expect(err).NotTo(HaveOccurred())

	a2, a3 := policy("MeshTimeout", "default", "a", `{"v":2}`), policy("MeshTimeout", "default", "a", `{"v":3}`)
	a2.Generation, a3.Generation = 2, 3
	b2 := policy("MeshTimeout", "default", "b", `{"v":2}`)
	b2.Generation = 2
	bKey := resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "b"}
	s2, err := b.Update([]resource.Resource{a2, a3, b2}, []resource.Key{bKey, bKey})
	g.Expect(err).NotTo(HaveOccurred())
	changed, ok := s2.ChangesFrom(s1)
	g.Expect(ok).To(BeTrue())
	g.Expect(changed["MeshTimeout"]).To(ConsistOf("default/a", "default/b"))
	g.Expect(s2.Len()).To(Equal(2), "the Mesh and a; b deleted once")
	g.Expect(s2.Type("MeshTimeout")).To(HaveLen(1))
	want, err := kds.NewEntry(&a3)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s2.Type("MeshTimeout")["default/a"].Version).To(Equal(want.Version), "the last write of a")
}

// A stored resource its caller could not read (given as unreadable) is listed with its column,
// keeps the version served before (or is left out), through a full build and an update, and is
// served again once it is read: as it was served (a fix by hand, no new generation), or changed.
func TestAnUnreadableResourceKeepsItsServedVersionUntilItIsRead(t *testing.T) {
	g := NewWithT(t)
	var b kds.SnapshotBuilder
	a := policy("MeshTimeout", "default", "a", `{"v":1}`)
	s1, err := b.Build([]resource.Resource{meshResource("default"), a})
	g.Expect(err).NotTo(HaveOccurred())
	served := s1.Type("MeshTimeout")["default/a"]
	badA := kds.Unservable{Key: a.Key(), Generation: 1, Column: "labels", Error: "invalid character"}
	badN := kds.Unservable{Key: resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "new"}, Generation: 3, Column: "owners", Error: "cannot unmarshal"}

	s2, err := b.Build([]resource.Resource{meshResource("default")}, badA, badN)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s2.Type("MeshTimeout")).To(Equal(map[string]*engine.Entry{"default/a": served}), "a keeps its served version; new is left out")
	g.Expect(b.Unservable()).To(Equal([]kds.Unservable{badA, badN}))

	b2 := policy("MeshTimeout", "default", "b", `{}`)
	s3, err := b.Update([]resource.Resource{b2}, nil, badA)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s3.Type("MeshTimeout")).To(HaveKeyWithValue("default/a", served))
	g.Expect(s3.Type("MeshTimeout")).To(HaveKey("default/b"))
	g.Expect(b.Unservable()).To(Equal([]kds.Unservable{badA, badN}))

	s4, err := b.Update([]resource.Resource{a}, nil) // read again as it was served
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s4).To(BeIdenticalTo(s3), "nothing to send")
	g.Expect(b.Unservable()).To(Equal([]kds.Unservable{badN}))

	n := policy("MeshTimeout", "default", "new", `{}`)
	n.Generation = 3
	s5, err := b.Update([]resource.Resource{n}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s5.Type("MeshTimeout")).To(HaveKey("default/new"))
	g.Expect(b.Unservable()).To(BeEmpty())
}

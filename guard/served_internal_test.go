package guard

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"
)

// What is served after each answer of the wrapped cache: a whole state replaces what was
// (Clusters), a partial one changes it (Endpoints: what changed, less what the cache no longer
// returns). A feed's served is shared by the streams that read it, so folding an answer into it
// leaves it as it was; a stream's own is changed in place.
func TestFoldingAnAnswerIntoWhatIsServed(t *testing.T) {
	it := func(name, version string) *item { return &item{name: name, version: version} }
	a1, b1, c1, a2, d1 := it("a", "1"), it("b", "1"), it("c", "1"), it("a", "2"), it("d", "1")
	names := func(sv *served) []string {
		var out []string
		for _, x := range sv.all() {
			out = append(out, x.name+"@"+x.version)
		}
		return out
	}
	returned := func(items ...*item) map[string]string {
		m := map[string]string{}
		for _, x := range items {
			m[x.name] = x.version
		}
		return m
	}
	for _, inPlace := range []bool{false, true} {
		g := NewWithT(t)
		// Clusters: each answer is the whole state.
		full := (*served)(nil).fold(resource.ClusterType, []*item{c1, a1, b1}, "v1", nil, inPlace)
		g.Expect(names(full)).To(Equal([]string{"a@1", "b@1", "c@1"}))
		next := full.fold(resource.ClusterType, []*item{b1, a2, c1}, "v2", nil, inPlace) // the same names
		g.Expect(names(next)).To(Equal([]string{"a@2", "b@1", "c@1"}))
		g.Expect(next.get("a")).To(BeIdenticalTo(a2))
		g.Expect(next.version).To(Equal("v2"))
		next = next.fold(resource.ClusterType, []*item{d1, a2}, "v3", nil, inPlace) // b and c gone, d new
		g.Expect(names(next)).To(Equal([]string{"a@2", "d@1"}))
		g.Expect(next.get("b")).To(BeNil())

		// Endpoints: each answer is what changed since what the watch was returned.
		part := (*served)(nil).fold(resource.EndpointType, []*item{a1, b1, c1}, "v1", returned(a1, b1, c1), inPlace)
		before := slices.Clone(part.sorted)
		beforeNames := maps.Clone(part.byName)
		next = part.fold(resource.EndpointType, []*item{a2}, "v2", returned(a2, b1, c1), inPlace)
		g.Expect(names(next)).To(Equal([]string{"a@2", "b@1", "c@1"}))
		next2 := next.fold(resource.EndpointType, []*item{d1}, "v3", returned(a2, c1, d1), inPlace) // b no longer returned
		g.Expect(names(next2)).To(Equal([]string{"a@2", "c@1", "d@1"}))
		g.Expect(next2.returned).To(Equal(returned(a2, c1, d1)))
		if inPlace {
			g.Expect(next2.anys).To(BeNil(), "a stream's own served changes: no list to share")
		} else {
			g.Expect(next2.anys).To(HaveLen(3))
			g.Expect(next2.wires).To(HaveLen(3))
			for i, x := range next2.sorted {
				g.Expect(next2.anys[i]).To(BeIdenticalTo(x.any))
				g.Expect(next2.wires[i].GetName()).To(Equal(x.name))
				g.Expect(next2.wires[i].GetVersion()).To(Equal(x.version))
			}
			g.Expect(next2.whole(next2.sorted)).To(BeTrue())
			g.Expect(next2.whole(slices.Clone(next2.sorted))).To(BeFalse(), "a copy is not the served's own")
			g.Expect(next2.whole(next2.sorted[:2])).To(BeFalse())
		}
		if !inPlace {
			g.Expect(part.sorted).To(Equal(before), "a shared served is not changed by the next answer")
			g.Expect(part.byName).To(Equal(beforeNames))
			g.Expect(names(next)).To(Equal([]string{"a@2", "b@1", "c@1"}))
		}
	}
	g := NewWithT(t)
	g.Expect((*served)(nil).get("a")).To(BeNil())
	g.Expect((*served)(nil).all()).To(BeEmpty())
	// An answer that names a resource twice is served once.
	twice := (*served)(nil).fold(resource.ClusterType, []*item{a1, b1}, "v1", nil, true)
	twice = twice.fold(resource.ClusterType, []*item{a1, a2}, "v2", nil, true)
	g.Expect(names(twice)).To(Equal([]string{"a@2"}))
}

// The versions a response brings that the client has not accepted: the response's own items
// when all are new (no copy), else those new to it, sorted by name; the items given are never
// changed.
func TestTheNewVersionsOfAResponse(t *testing.T) {
	g := NewWithT(t)
	it := func(name, version string) *item { return &item{name: name, version: version} }
	a1, b1, b2, c1 := it("a", "1"), it("b", "1"), it("b", "2"), it("c", "1")
	ts := &typeState{}
	items := []*item{a1, b2, c1}
	fresh := newVersions(ts, items)
	g.Expect(fresh).To(HaveLen(3))
	g.Expect(&fresh[0]).To(BeIdenticalTo(&items[0]), "all new: the items themselves")

	ts.acked.set("a", a1)
	ts.acked.set("b", b1)
	fresh = newVersions(ts, items)
	g.Expect([]*item(fresh)).To(Equal([]*item{b2, c1}))
	v, ok := fresh.get("b")
	g.Expect(ok).To(BeTrue())
	g.Expect(v).To(Equal("2"))
	_, ok = fresh.get("a")
	g.Expect(ok).To(BeFalse(), "a is accepted at that version")

	unsorted := []*item{c1, b2}
	fresh = newVersions(&typeState{}, unsorted)
	g.Expect([]*item(fresh)).To(Equal([]*item{b2, c1}))
	g.Expect(unsorted).To(Equal([]*item{c1, b2}), "the items given are left as they were")
}

// A delta response the server's watch was canceled before taking is undone: what the client
// was sent goes back to what it was, names new in the response dropped, names updated or
// removed by it restored.
func TestAnUntakenDeltaResponseIsUndone(t *testing.T) {
	g := NewWithT(t)
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{NoHolds: true})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	s := newSession(gd, -1, true)
	it := func(name, version string) *item { return &item{name: name, version: version} }
	a1, a2, b1, c1 := it("a", "1"), it("a", "2"), it("b", "1"), it("c", "1")

	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.typeOf(resource.ClusterType)
	ts.sub = stream.NewSotwSubscription(nil, true)
	ts.seeded = true
	ts.sentView.set("a", a1)
	ts.sentView.set("c", c1)
	before := sentView(ts)
	ts.served = (*served)(nil).fold(resource.ClusterType, []*item{a2, b1}, "v2", nil, true)
	w := &watch{sub: ts.sub}
	s.respondDeltaLocked(ts, w, ts.served.all()) // a updated, b new, c removed
	g.Expect(s.outq).To(HaveLen(1))
	q := s.outq[0]
	g.Expect(deltaNamesOf(q.f)).To(Equal([]string{"a", "b"}))
	g.Expect(q.f.removed).To(Equal([]string{"c"}))
	g.Expect(sentView(ts)).To(Equal(map[string]*item{"a": a2, "b": b1}))

	s.undoLocked(ts, q.f)
	g.Expect(sentView(ts)).To(Equal(before))
	g.Expect(ts.flight).To(BeEmpty())
}

// Delta clients in step with what a feed serves hold its own map of it, one for every client,
// whatever the updates: while their first response is in flight, after it, each update, and more updates than what
// differs from that map may hold (they then take the newest feed's map). A client that comes
// back holding everything (initial_resource_versions) gets nothing, and joins them once updates
// have changed a sixteenth of its names.
func TestDeltaClientsInStepShareTheFeedsMapOfWhatTheyHold(t *testing.T) {
	g := NewWithT(t)
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{NoHolds: true})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	it := func(name, version string) *item { return &item{name: name, version: version} }
	var items []*item
	for i := range 100 {
		items = append(items, it(fmt.Sprintf("c%03d", i), "1"))
	}
	sv := (*served)(nil).fold(resource.ClusterType, items, "v1", nil, false)

	var sessions []*session
	var states []*typeState
	for id := range int64(3) {
		var holds map[string]string
		if id == 2 { // back, holding everything
			holds = map[string]string{}
			for _, it := range items {
				holds[it.name] = it.version
			}
		}
		s := newSession(gd, -1-id, true)
		s.mu.Lock()
		ts := s.typeOf(resource.ClusterType)
		ts.sub = stream.NewDeltaSubscription(nil, nil, holds, true)
		s.mu.Unlock()
		sessions, states = append(sessions, s), append(states, ts)
	}
	// respond serves sv to every session, and answers its response, which carries want names.
	respond := func(want int) {
		for i, s := range sessions {
			ts := states[i]
			s.mu.Lock()
			ts.served = sv
			s.respondDeltaLocked(ts, &watch{sub: ts.sub}, sv.all())
			if want == len(items) && i == 2 {
				g.Expect(s.outq).To(BeEmpty(), "it holds everything")
				g.Expect(held(&ts.acked)).To(Equal(sv.byName))
				s.mu.Unlock()
				continue
			}
			g.Expect(s.outq).To(HaveLen(1))
			f := s.outq[0].f
			s.outq = nil
			g.Expect(f.items).To(HaveLen(want))
			g.Expect(sentView(ts)).To(HaveLen(len(items)))
			g.Expect(sentView(ts)).NotTo(Equal(held(&ts.acked)), "in flight: the sent view is ahead of what was accepted")
			if want == len(items) {
				g.Expect(sameMap(ts.sentView.base, sv.byName)).To(BeTrue(), "no map of the first response: the served's")
				g.Expect(ts.sentView.over).To(BeNil())
			}
			ts.flight = slices.DeleteFunc(ts.flight, func(x *flight) bool { return x == f })
			s.answerLocked(ts, f, nil)
			g.Expect(sentView(ts)).To(Equal(held(&ts.acked)), "accepted: the sent view is what the client holds")
			g.Expect(held(&ts.acked)).To(Equal(sv.byName))
			s.mu.Unlock()
		}
	}

	respond(100)
	for _, ts := range states[:2] {
		g.Expect(sameMap(ts.acked.base, sv.byName)).To(BeTrue(), "the feed's map")
		g.Expect(ts.acked.over).To(BeNil())
	}
	g.Expect(states[2].acked.base).To(BeNil(), "a map of its own, seeded")
	first := sv.byName
	for u := range 20 {
		items = slices.Clone(items)
		items[u] = it(items[u].name, "2")
		sv = (*served)(nil).fold(resource.ClusterType, items, fmt.Sprintf("v%d", u+2), nil, false)
		respond(1)
		for _, ts := range states {
			g.Expect(len(ts.acked.over)).To(BeNumerically("<=", 8), "update %d", u)
		}
	}
	for _, ts := range states {
		g.Expect(ts.acked.base).NotTo(BeNil())
		g.Expect(sameMap(ts.acked.base, first)).To(BeFalse(), "settled on a newer feed's map")
	}
	g.Expect(sameMap(states[0].acked.base, states[1].acked.base)).To(BeTrue(), "the same for clients in step")
}

// held is what h holds, as one map.
func held(h *holding) map[string]*item {
	out := map[string]*item{}
	for n, it := range h.all() {
		out[n] = it
	}
	return out
}

func sameMap(a, b map[string]*item) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// sentView is a delta stream's sent view of ts as one map.
func sentView(ts *typeState) map[string]*item { return held(&ts.sentView) }

// What a delta client was sent and keeps, under random edits as a delta session makes them
// (responses, answers, refusals, new streams' first responses of everything a served holds),
// reads as a plain map would: every name, its count, the names beyond a view.
func TestTheSentViewIsWhatWasSentAndKept(t *testing.T) {
	g := NewWithT(t)
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{NoHolds: true})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	s := newSession(gd, -1, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.typeOf(resource.ClusterType)

	var pool []*item
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		for _, v := range []string{"1", "2", "3"} {
			pool = append(pool, &item{name: n, version: v})
		}
	}
	wantSent, wantAcked := map[string]*item{}, map[string]*item{}
	set := func(m map[string]*item, n string, it *item) {
		if it == nil {
			delete(m, n)
		} else {
			m[n] = it
		}
	}
	rng := rand.New(rand.NewPCG(1, 24))
	wholes := 0
	for step := range 20000 {
		it := pool[rng.IntN(len(pool))]
		var val *item
		if rng.IntN(4) > 0 {
			val = it
		}
		switch rng.IntN(4) {
		case 3: // a response of everything a shared served holds, to a client that holds nothing
			if rng.IntN(10) > 0 {
				continue
			}
			ts.acked, ts.sentView = holding{}, holding{} // a new stream
			clear(wantSent)
			clear(wantAcked)
			var items []*item
			for _, n := range rng.Perm(6)[:1+rng.IntN(6)] {
				items = append(items, pool[3*n+rng.IntN(3)])
			}
			sv := (*served)(nil).fold(resource.ClusterType, items, "v", nil, false)
			ts.sentView.holdServed(sv)
			maps.Copy(wantSent, sv.byName)
			wholes++
		case 0: // a response sends it, or removes it, or the client unsubscribes
			ts.sentView.set(it.name, val)
			set(wantSent, it.name, val)
		case 1: // an answer: the client accepted it, or the removal
			ts.acked.set(it.name, val)
			set(wantAcked, it.name, val)
		case 2: // a refusal: the client keeps what it accepted
			s.keptLocked(ts, it.name)
			set(wantSent, it.name, wantAcked[it.name])
		}
		g.Expect(held(&ts.acked)).To(Equal(wantAcked), "step %d", step)
		g.Expect(sentView(ts)).To(Equal(wantSent), "step %d", step)
		g.Expect(ts.sentView.len()).To(Equal(len(wantSent)), "step %d", step)
		view := []*item{pool[rng.IntN(len(pool))]}
		notIn := maps.Clone(wantSent)
		delete(notIn, view[0].name)
		g.Expect(ts.sentNotIn(view)).To(Equal(notIn), "step %d", step)
	}
	g.Expect(wholes).To(BeNumerically(">", 10), "responses of everything were made")
}

func deltaNamesOf(f *flight) []string {
	var out []string
	for _, r := range f.delta.GetResources() {
		out = append(out, r.GetName())
	}
	return out
}

// A bad resource met by every stream that reads the same answer is logged once, however the
// streams interleave; the same resource at another version is logged again.
func TestABadResourceIsLoggedOnce(t *testing.T) {
	g := NewWithT(t)
	var out strings.Builder
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{Logger: slog.New(slog.NewTextHandler(&out, nil))})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	for range 100 { // two bad resources, met by a hundred streams in turn
		gd.logBad("Cluster/a@1", "bad", "name", "a")
		gd.logBad("Cluster/b@1", "bad", "name", "b")
	}
	gd.logBad("Cluster/a@2", "bad", "name", "a")
	g.Expect(strings.Count(out.String(), "level=ERROR msg=bad")).To(Equal(3))
}

package guard

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/shared"
)

// reviewModel drives one session through random events, as the server and a client would:
// the cache serves other versions, the client answers responses (ACK or NACK) and asks for
// other names, a retry round resends names. Routes reference clusters, clusters their load
// assignments.
type reviewModel struct {
	t       *testing.T
	rng     *rand.Rand
	s       *session
	delta   bool
	node    *core.Node
	pool    map[string][][]*item // by type URL: each name's versions, by name index
	subs    map[string]stream.Subscription
	cancels map[string]func()
	nonce   int
}

var modelTypes = []string{resource.RouteType, resource.ClusterType, resource.EndpointType}

func newReviewModel(t *testing.T, delta bool, seed uint64, opts Options) *reviewModel {
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gd.Close)
	id := int64(seed + 1)
	if delta {
		id = -id
	}
	m := &reviewModel{t: t, rng: rand.New(rand.NewPCG(seed, 48)), s: newSession(gd, id, delta), delta: delta,
		node: &core.Node{Id: "client"}, pool: map[string][][]*item{}, subs: map[string]stream.Subscription{}, cancels: map[string]func(){}}
	ref := func(typeURL string, i int) Ref { return Ref{TypeURL: typeURL, Name: fmt.Sprintf("n%d", i)} }
	for i := range 6 {
		var rs, cs, es []*item
		for v := range 3 {
			version := fmt.Sprint(v)
			r := &item{name: fmt.Sprintf("n%d", i), version: version, refs: []Ref{ref(resource.ClusterType, (i+v)%6)}}
			if v == 1 {
				r.refs = append(r.refs, ref(resource.ClusterType, (i+3)%6))
			}
			rs = append(rs, r)
			c := &item{name: fmt.Sprintf("n%d", i), version: version}
			if v < 2 {
				c.refs = []Ref{ref(resource.EndpointType, (i+v)%6)}
			}
			cs = append(cs, c)
			es = append(es, &item{name: fmt.Sprintf("n%d", i), version: version})
		}
		m.pool[resource.RouteType] = append(m.pool[resource.RouteType], rs)
		m.pool[resource.ClusterType] = append(m.pool[resource.ClusterType], cs)
		m.pool[resource.EndpointType] = append(m.pool[resource.EndpointType], es)
	}
	for _, typeURL := range modelTypes[:2] { // load assignments come later: a type asked for anew
		m.serve(typeURL)
		m.ask(typeURL, false)
	}
	return m
}

// serve makes the cache serve a random set of the type's names, at random versions.
func (m *reviewModel) serve(typeURL string) {
	var items []*item
	for _, versions := range m.pool[typeURL] {
		if m.rng.IntN(5) > 0 {
			items = append(items, versions[m.rng.IntN(len(versions))])
		}
	}
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.types[typeURL]
	if ts == nil {
		return // not asked for yet
	}
	s.serveLocked(ts, ts.served.fold(typeURL, items, fmt.Sprint(m.rng.Int()), nil, true))
	s.evaluateLocked(ts)
}

// names are a random set of the pool's names.
func (m *reviewModel) names() []string {
	var out []string
	for i := range 6 {
		if m.rng.IntN(3) > 0 {
			out = append(out, fmt.Sprintf("n%d", i))
		}
	}
	return out
}

// ask sends a request of typeURL, which asks for other names if other, and opens its next watch.
func (m *reviewModel) ask(typeURL string, other bool) {
	sub, ok := m.subs[typeURL]
	if !ok {
		defer m.serve(typeURL) // the wrapped cache answers the first watch of the type
	}
	asks := other || !ok
	if asks {
		names := m.names()
		wildcard := typeURL == resource.ClusterType && m.rng.IntN(2) == 0
		if m.delta {
			if !ok { // a new stream: the client says what it holds from an old one
				initial := map[string]string{}
				for _, n := range m.names() {
					initial[n] = fmt.Sprint(m.rng.IntN(3))
				}
				sub = stream.NewDeltaSubscription(nil, nil, initial, false)
			}
			var unsub []string
			for n := range sub.SubscribedResources() {
				unsub = append(unsub, n)
			}
			if wildcard {
				names = append(names, "*")
			} else {
				unsub = append(unsub, "*")
			}
			sub.UpdateResourceSubscriptions(names, unsub)
		} else {
			if wildcard {
				names = nil
			}
			sub = stream.NewSotwSubscription(names, true)
		}
		m.subs[typeURL] = sub
	}
	m.s.request(m.node, typeURL, "", nil, asks && m.delta)
	m.rewatch(typeURL, sub)
}

func (m *reviewModel) rewatch(typeURL string, sub stream.Subscription) {
	if cancel := m.cancels[typeURL]; cancel != nil {
		cancel()
	}
	w := &watch{sub: sub}
	if m.delta {
		w.deltaReq, w.deltaOut = &discovery.DeltaDiscoveryRequest{TypeUrl: typeURL}, make(chan cache.DeltaResponse, 1)
	} else {
		w.req, w.out = &discovery.DiscoveryRequest{TypeUrl: typeURL}, make(chan cache.Response, 1)
	}
	cancel, err := m.s.watch(w, typeURL, m.node)
	if err != nil {
		m.t.Fatal(err)
	}
	m.cancels[typeURL] = cancel
}

// answer answers one response the session made, if any: an ACK, or a NACK of one of its names.
func (m *reviewModel) answer() {
	s := m.s
	s.mu.Lock()
	if len(s.outq) == 0 {
		s.mu.Unlock()
		return
	}
	q := s.outq[0]
	s.outq = s.outq[1:]
	s.mu.Unlock()
	m.nonce++
	nonce := fmt.Sprint(m.nonce)
	s.sent(q.ts.typeURL, nonce, func(f *flight) bool { return f == q.f })
	var detail *rpcstatus.Status
	if len(q.f.items) > 0 && m.rng.IntN(4) == 0 {
		detail = &rpcstatus.Status{Code: 3, Message: fmt.Sprintf(`resource %q: refused`, q.f.items[m.rng.IntN(len(q.f.items))].name)}
	}
	s.request(m.node, q.ts.typeURL, nonce, detail, false)
	s.reviewIfAsked()
	m.rewatch(q.ts.typeURL, m.subs[q.ts.typeURL])
}

// resend is a retry round of random names of a type.
func (m *reviewModel) resend(typeURL string) {
	m.s.Resend(map[string][]string{typeURL: m.names()})
}

// checkMade checks that the view made for each type with nothing marked since is the view a
// full evaluation makes now, with what it withholds, and what waits.
func (m *reviewModel) checkMade(g *WithT, step int) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, typeURL := range modelTypes {
		ts := s.types[typeURL]
		if ts == nil || !ts.made || len(ts.dirty) > 0 || ts.madeServed != ts.served {
			continue
		}
		if ts.w == nil { // no watch to answer: the view is made for the next one
			ts.w = &watch{sub: ts.sub}
			defer func() { ts.w = nil }()
		}
		ins := s.insight[typeURL]
		withheld, waiting := slices.Clone(ins.Withheld), maps.Clone(ts.waiting)
		items, _ := s.viewLocked(ts, nil)
		g.Expect(slices.Clone(ins.Withheld)).To(Equal(withheld), "step %d: %s: what is withheld", step, typeURL)
		g.Expect(slices.Sorted(maps.Keys(ts.waiting))).To(Equal(slices.Sorted(maps.Keys(waiting))), "step %d: %s: what waits", step, typeURL)
		if !m.delta {
			g.Expect(slices.Clip(append([]*item{}, items...))).To(Equal(slices.Clip(append([]*item{}, ts.lastView...))), "step %d: %s: the view", step, typeURL)
			continue
		}
		sent := map[string]string{}
		for n, it := range ts.sentView.all() {
			sent[n] = it.version
		}
		view := map[string]string{}
		for _, it := range items {
			view[it.name] = it.version
		}
		g.Expect(sent).To(Equal(view), "step %d: %s: the view", step, typeURL)
	}
}

// After any sequence of what a server and a client do, the view made for a type whose names
// have not been marked since is still what a full evaluation finds: an answer, a new version
// served, a request for other names, a retry round and an owner check's verdicts mark every
// name whose view they may change, here and in the types that depend on it.
func TestAViewLookedAtByWhatChangedIsTheFullView(t *testing.T) {
	for _, c := range []struct {
		delta, owner bool
		seeds        uint64
	}{{false, false, 16}, {true, false, 16}, {false, true, 4}, {true, true, 4}} {
		for seed := range c.seeds {
			t.Run(fmt.Sprintf("delta=%v/owner=%v/seed=%d", c.delta, c.owner, seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					g := NewWithT(t)
					var opts Options
					if c.owner {
						opts.OwnerCheck = func() shared.OwnerCheck { return ownerpredict.New() }
					}
					m := newReviewModel(t, c.delta, seed, opts)
					for step := range 1500 {
						typeURL := modelTypes[m.rng.IntN(len(modelTypes))]
						switch op := m.rng.IntN(20); {
						case op < 3:
							m.serve(typeURL)
						case op < 5:
							m.ask(typeURL, true)
						case op < 6:
							m.resend(typeURL)
						default:
							m.answer()
						}
						if c.owner {
							synctest.Wait() // the owner check, off the stream's goroutine
						}
						m.checkMade(g, step)
					}
				})
			})
		}
	}
}

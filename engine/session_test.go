package engine

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine/nack"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// zoneModel is what a zone holds as the global must believe it: the answers to the responses it
// remembers, applied in order. A response it forgot (more than MaxInFlight unanswered) changes
// nothing, and neither does an answer to it.
type zoneModel struct {
	acked map[string]map[string]string // kind -> name -> version
	// What the insight counts: responses sent, and the answers the global applied.
	responses, acks, nacks map[string]int64
	pending                []*modelResponse // what the global remembers, oldest first
}

type modelResponse struct {
	nack        bool // answered with a NACK
	nonce, kind string
	versions    map[string]string
	removed     []string
}

func (m *zoneModel) answer(r *modelResponse, rejected map[string]bool) {
	i := slices.Index(m.pending, r)
	if i < 0 {
		return // forgotten: the global ignores the answer
	}
	m.pending = slices.Delete(m.pending, i, i+1)
	if len(rejected) > 0 || r.nack {
		m.nacks[r.kind]++
	} else {
		m.acks[r.kind]++
	}
	if m.acked[r.kind] == nil {
		m.acked[r.kind] = map[string]string{}
	}
	for n, v := range r.versions {
		if !rejected[n] {
			m.acked[r.kind][n] = v
		}
	}
	for _, n := range r.removed {
		if !rejected[n] {
			delete(m.acked[r.kind], n)
		}
	}
}

func (m *zoneModel) digest() Digest {
	var d Digest
	for kind, names := range m.acked {
		for n, v := range names {
			d.Sum ^= ackedHash(kind, n, v)
			d.N++
		}
	}
	return d
}

// The session's view of what a zone ACKed (one map per kind with the responses in flight and the
// refused names laid over it) equals, after every step of a random run of responses, ACKs,
// NACKs of some names, answers to forgotten responses and unanswered bursts, what the zone
// holds by a plain model; and so do the digest and the per-kind counts, kept as it changes.
func TestTheSessionSaysWhatTheZoneACKed(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { sessionModelRun(t, seed) })
	}
}

func sessionModelRun(t *testing.T, seed uint64) {
	g := NewWithT(t)
	rnd := rand.New(rand.NewPCG(seed, 7))
	kinds := []string{"Mesh", "MeshTimeout"}
	c := NewCache(kinds)
	defer c.Close()
	tr := NewTracker(c)
	g.Expect(tr.OnDeltaStreamOpen(context.Background(), 1, "")).To(Succeed())
	for i, k := range kinds {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: k}
		if i == 0 {
			req.Node = &core.Node{Id: "zone-1"}
		}
		g.Expect(tr.OnStreamDeltaRequest(1, req)).To(Succeed())
	}
	defer tr.OnDeltaStreamClosed(1, nil)
	s := c.Session(1)
	z := NewNodes(c)
	z.streamOpened(1, "zone-1")

	m := &zoneModel{acked: map[string]map[string]string{}, responses: map[string]int64{}, acks: map[string]int64{}, nacks: map[string]int64{}}
	var all []*modelResponse // every response sent, answered or not
	names := []string{"default/a", "default/b", "default/c", "default/d", "default/e"}
	nonce := 0
	for step := range 300 {
		switch op := rnd.IntN(10); {
		case op < 4 || len(m.pending) == 0: // a response
			nonce++
			r := &modelResponse{nonce: strconv.Itoa(nonce), kind: kinds[rnd.IntN(2)], versions: map[string]string{}}
			resp := &discovery.DeltaDiscoveryResponse{TypeUrl: r.kind, Nonce: r.nonce}
			for _, n := range names {
				switch rnd.IntN(4) {
				case 0:
					v := strconv.Itoa(rnd.IntN(3))
					r.versions[n] = v
					resp.Resources = append(resp.Resources, &discovery.Resource{Name: n, Version: v})
				case 1:
					r.removed = append(r.removed, n)
					resp.RemovedResources = append(resp.RemovedResources, n)
				}
			}
			tr.OnStreamDeltaResponse(1, nil, resp)
			m.responses[r.kind]++
			m.pending = append(m.pending, r)
			all = append(all, r)
			if len(m.pending) > MaxInFlight {
				m.pending = m.pending[1:]
			}
			if rnd.IntN(20) == 0 { // a burst the zone never answers
				for range MaxInFlight {
					nonce++
					r := &modelResponse{nonce: strconv.Itoa(nonce), kind: "Mesh", versions: map[string]string{"default/x": strconv.Itoa(nonce)}}
					tr.OnStreamDeltaResponse(1, nil, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: r.nonce,
						Resources: []*discovery.Resource{{Name: "default/x", Version: r.versions["default/x"]}}})
					m.responses["Mesh"]++
					m.pending = append(m.pending, r)
					if len(m.pending) > MaxInFlight {
						m.pending = m.pending[1:]
					}
				}
			}
		default: // an answer: to the oldest remembered, or now and then to a forgotten one
			r := m.pending[0] // zones answer in order
			if o := all[rnd.IntN(len(all))]; rnd.IntN(10) == 0 && !slices.Contains(m.pending, o) {
				r = o // answered already, or forgotten
			}
			req := &discovery.DeltaDiscoveryRequest{TypeUrl: r.kind, ResponseNonce: r.nonce}
			rejected := map[string]bool{}
			if rnd.IntN(2) == 0 {
				list := &kdsv1.RejectionList{Kind: r.kind}
				for _, n := range slices.Sorted(maps.Keys(r.versions)) {
					if rnd.IntN(2) == 0 {
						rejected[n] = true
						list.Rejections = append(list.Rejections, &kdsv1.Rejection{Name: n, Reason: "no"})
					}
				}
				detail, err := nack.Detail(list, "rejected")
				g.Expect(err).NotTo(HaveOccurred())
				req.ErrorDetail = detail
			}
			r.nack = req.ErrorDetail != nil
			g.Expect(tr.OnStreamDeltaRequest(1, req)).To(Succeed())
			m.answer(r, rejected)
		}

		for _, kind := range kinds {
			got := map[string]string{}
			s.Acked([]string{kind}, func(_, n, v string) { got[n] = v })
			want := m.acked[kind]
			if want == nil {
				want = map[string]string{}
			}
			g.Expect(got).To(Equal(want), "step %d, %s", step, kind)
			for _, n := range append(names, "default/x") {
				v, ok := z.AckedVersion("zone-1", kind, n)
				wv, wok := want[n]
				g.Expect([]any{v, ok}).To(Equal([]any{wv, wok}), "step %d, %s %s", step, kind, n)
			}
			known := 0 // a kind the zone has ACKed something of is in the insight
			for _, ki := range s.Insight() {
				if ki.TypeURL == kind {
					known = ki.Known
				}
			}
			g.Expect(known).To(Equal(len(want)), "step %d, %s count", step, kind)
		}
		g.Expect(z.InventoryDigest("zone-1")).To(Equal(m.digest()), "step %d", step)
		for _, ki := range s.Insight() {
			g.Expect([]int64{ki.Responses, ki.ACKs, ki.NACKs}).To(Equal([]int64{m.responses[ki.TypeURL], m.acks[ki.TypeURL], m.nacks[ki.TypeURL]}), "step %d, %s insight", step, ki.TypeURL)
		}
		g.Expect(s.InFlight()).To(Equal(len(m.pending)), "step %d", step)
		g.Expect(z.InventoryKeys("zone-1", nil, nil)).To(HaveLen(m.digest().N))
	}
}

// A zone's counters add up across its streams: a new stream's session starts at zero, and the
// zone table keeps what the earlier ones counted.
func TestAZonesCountersAddUpAcrossItsStreams(t *testing.T) {
	g := NewWithT(t)
	c := NewCache([]string{"MeshTimeout"})
	defer c.Close()
	z := NewNodes(c)
	tr := NewTracker(c, z.Observer())
	for id := range int64(3) {
		stream := id + 1
		g.Expect(tr.OnDeltaStreamOpen(context.Background(), stream, "")).To(Succeed())
		g.Expect(tr.OnStreamDeltaRequest(stream, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "zone-1"}, TypeUrl: "MeshTimeout"})).To(Succeed())
		tr.OnStreamDeltaResponse(stream, nil, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "1",
			Resources: []*discovery.Resource{{Name: "m/a", Version: "1"}, {Name: "m/b", Version: "1"}}})
		g.Expect(tr.OnStreamDeltaRequest(stream, &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResponseNonce: "1"})).To(Succeed())
		tr.OnDeltaStreamClosed(stream, nil)
	}
	zi := z.Insights()
	g.Expect(zi).To(HaveLen(1))
	g.Expect(zi[0].Stream).To(Equal(int64(3)))
	g.Expect(zi[0].Types).To(HaveLen(1))
	ki := zi[0].Types[0]
	g.Expect([]int64{ki.Responses, ki.Sent, ki.ACKs, ki.NACKs}).To(Equal([]int64{3, 6, 3, 0}))
	g.Expect(ki.Known).To(Equal(2), "what the last stream's zone ACKed")
	g.Expect(z.Streams()).To(BeEmpty(), "no stream is open")
}

// The ACK of a first response that carried every entry of its kind is accounted in one step
// (the snapshot's sum of them): the digest and the count are what accounting each entry gives.
func TestAnACKOfAWholeKindCountsEachOfItsEntries(t *testing.T) {
	g := NewWithT(t)
	var b testSnapshots
	snap, err := b.Build([]resource.Resource{{Kind: resource.MeshKind, Name: "m1", Generation: 1},
		{Kind: resource.MeshKind, Name: "m2", Generation: 3}, {Kind: resource.MeshKind, Name: "m3", Generation: 2}})
	g.Expect(err).NotTo(HaveOccurred())
	c := NewCache([]string{resource.MeshKind})
	defer c.Close()
	c.SetSnapshot(snap)
	tr := NewTracker(c)
	g.Expect(tr.OnDeltaStreamOpen(context.Background(), 1, "")).To(Succeed())
	defer tr.OnDeltaStreamClosed(1, nil)
	g.Expect(tr.OnStreamDeltaRequest(1, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.MeshKind, Node: &core.Node{Id: "zone-1"}})).To(Succeed())
	z := NewNodes(c)
	z.streamOpened(1, "zone-1")
	s := c.Session(1)

	resp := &discovery.DeltaDiscoveryResponse{TypeUrl: resource.MeshKind, Nonce: "1"}
	want := &zoneModel{acked: map[string]map[string]string{resource.MeshKind: {}}}
	for _, n := range snap.Names(resource.MeshKind) {
		e := snap.Type(resource.MeshKind)[n]
		resp.Resources = append(resp.Resources, e.Wire)
		want.acked[resource.MeshKind][n] = e.Version
	}
	tr.OnStreamDeltaResponse(1, nil, resp)
	s.mu.Lock()
	inflight := slices.Clone(s.inflight)
	s.mu.Unlock()
	g.Expect(inflight).To(HaveLen(1))
	g.Expect(inflight[0].all).To(BeTrue(), "the response carries the whole kind")

	g.Expect(tr.OnStreamDeltaRequest(1, &discovery.DeltaDiscoveryRequest{TypeUrl: resource.MeshKind, ResponseNonce: "1"})).To(Succeed())
	g.Expect(z.InventoryDigest("zone-1")).To(Equal(want.digest()))
	g.Expect(z.InventoryDigest("zone-1").N).To(Equal(3))
	for _, ki := range s.Insight() {
		g.Expect(ki.Known).To(Equal(3))
	}
}

// A session keeps a state per kind the zone asks for: the cache's kinds by their place, any
// other type a zone names by its name; each is made once, and each is visited once, the cache's
// kinds first in the cache's order.
func TestASessionKeepsEveryKindItIsAskedFor(t *testing.T) {
	g := NewWithT(t)
	s := newSession(NewCache([]string{"Mesh", "MeshTimeout"}), 1, nil, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range []string{"MeshTimeout", "NotServed", "Mesh"} {
		ks := s.kind(k)
		g.Expect(s.kind(k)).To(BeIdenticalTo(ks), k)
		g.Expect(s.kinds.get(s.cache, k)).To(BeIdenticalTo(ks), k)
		g.Expect(ks.name).To(Equal(k))
	}
	g.Expect(s.kinds.get(s.cache, "NeverAsked")).To(BeNil())
	var order []string
	s.kinds.each(func(ks *kindState) { order = append(order, ks.name) })
	g.Expect(order).To(Equal([]string{"Mesh", "MeshTimeout", "NotServed"}))
}

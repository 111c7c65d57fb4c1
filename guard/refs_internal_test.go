package guard

import (
	"fmt"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"
)

// A removed name kept while the client holds what references it says what: the first, by type
// URL and name, however many reference it. Finding it costs what references it, not a walk of
// everything the client holds (BenchmarkCostOfHeldRemovals).
func TestAHeldRemovalNamesTheFirstResourceThatReferencesIt(t *testing.T) {
	g := NewWithT(t)
	gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	s := newSession(gd, 1, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	clusters, endpoints := s.typeOf(resource.ClusterType), s.typeOf(resource.EndpointType)
	var cs []*item
	for i := range 20 {
		cs = append(cs, &item{name: fmt.Sprintf("c%02d", 19-i), version: "1", refs: []Ref{{TypeURL: resource.EndpointType, Name: "e"}}})
	}
	clusters.sub = stream.NewSotwSubscription(nil, true)
	clusters.served = (*served)(nil).fold(resource.ClusterType, cs, "1", nil, true)
	s.acceptLocked(clusters, cs, nil, nil)
	e := &item{name: "e", version: "1"}
	endpoints.sub = stream.NewSotwSubscription([]string{"e"}, true)
	endpoints.served = (*served)(nil).fold(resource.EndpointType, nil, "2", nil, true) // e no longer served
	s.acceptLocked(endpoints, []*item{e}, nil, nil)
	endpoints.w = &watch{sub: endpoints.sub}
	for range 10 {
		items, _ := s.viewLocked(endpoints, nil)
		g.Expect(items).To(Equal([]*item{e}), "kept")
		g.Expect(s.insight[resource.EndpointType].Withheld).To(Equal([]Withheld{{Name: "e",
			Reason: `removed, kept while the client holds Cluster "c00", which references it`}}))
	}
}

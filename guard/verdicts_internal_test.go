package guard

import (
	"fmt"
	"testing"
	"testing/synctest"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/shared"
)

// onlySession is the guard's one client stream.
func onlySession(g *Guard) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.streams {
		return s
	}
	return nil
}

// verdictNames are the names of typeURL with an owner verdict in s.
func verdictNames(s *session, typeURL string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if ts := s.types[typeURL]; ts != nil {
		for n := range ts.verdicts {
			out = append(out, n)
		}
	}
	return out
}

// The owner check's verdicts are of the names a client's view has: a name's go when the cache
// no longer serves it, when the client no longer asks for it, and every one when the stream
// closes. A cache whose names come and go costs the verdicts of the names it serves now.
func TestAnOwnerVerdictGoesWhenItsNameDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		h := newGuardedServer(t, Options{OwnerCheck: func() shared.OwnerCheck { return ownerpredict.New() }})
		generation := func(gen int) map[resource.Type][]types.Resource {
			var clusters []types.Resource
			for i := range 5 {
				clusters = append(clusters, eds(fmt.Sprintf("c%d-%d", gen, i)))
			}
			return map[resource.Type][]types.Resource{resource.ClusterType: clusters,
				resource.EndpointType: {endpointsOf("e1", 80), endpointsOf("e2", 80)}}
		}
		h.set(generation(0))
		c := h.delta()
		c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})
		c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"e1", "e2"}})
		answerDelta(c)
		s := onlySession(h.g)
		g.Expect(verdictNames(s, resource.ClusterType)).To(ConsistOf("c0-0", "c0-1", "c0-2", "c0-3", "c0-4"))
		g.Expect(verdictNames(s, resource.EndpointType)).To(ConsistOf("e1", "e2"))

		for gen := 1; gen <= 20; gen++ {
			h.set(generation(gen))
			answerDelta(c)
			g.Expect(verdictNames(s, resource.ClusterType)).To(ConsistOf(
				fmt.Sprintf("c%d-0", gen), fmt.Sprintf("c%d-1", gen), fmt.Sprintf("c%d-2", gen), fmt.Sprintf("c%d-3", gen), fmt.Sprintf("c%d-4", gen)),
				"generation %d: the names served now", gen)
		}

		c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesUnsubscribe: []string{"e2"}})
		answerDelta(c)
		g.Expect(verdictNames(s, resource.EndpointType)).To(ConsistOf("e1"), "e2 is no longer asked for")

		c.stop()
		g.Expect(verdictNames(s, resource.ClusterType)).To(BeEmpty(), "the stream closed")
		g.Expect(verdictNames(s, resource.EndpointType)).To(BeEmpty(), "the stream closed")
	})
}

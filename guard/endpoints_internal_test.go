package guard

import (
	"slices"
	"testing"
	"testing/synctest"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
)

// sotwClient is a SotW client that asks for the names it was told to, and ACKs every response.
type sotwClient struct {
	c     *sotwStream
	names map[string][]string // by type URL; none: every resource
	acked map[string]string   // the version ACKed, by type URL
	nonce map[string]string   // the last response's, by type URL
}

func newSotwClient(c *sotwStream) *sotwClient {
	return &sotwClient{c: c, names: map[string][]string{}, acked: map[string]string{}, nonce: map[string]string{}}
}

// ask asks for names of typeURL (none: every resource).
func (s *sotwClient) ask(typeURL string, names ...string) {
	s.names[typeURL] = names
	s.c.send(&discovery.DiscoveryRequest{Node: clientNode, TypeUrl: typeURL, ResourceNames: names,
		VersionInfo: s.acked[typeURL], ResponseNonce: s.nonce[typeURL]})
}

// answer ACKs every response until none comes, and returns them.
func (s *sotwClient) answer() []*discovery.DiscoveryResponse {
	var all []*discovery.DiscoveryResponse
	for rs := s.c.received(); len(rs) > 0; rs = s.c.received() {
		for _, r := range rs {
			t := r.GetTypeUrl()
			s.acked[t], s.nonce[t] = r.GetVersionInfo(), r.GetNonce()
			s.ask(t, s.names[t]...)
		}
		all = append(all, rs...)
	}
	return all
}

func withheldOf(g *Guard, typeURL string) []Withheld {
	var out []Withheld
	for _, c := range g.Clients() {
		for _, ti := range c.Types {
			if ti.TypeURL == typeURL {
				out = append(out, ti.Withheld...)
			}
		}
	}
	return out
}

// A removed cluster's endpoints are removed from a delta client once it no longer holds the
// cluster, though it never unsubscribes from them: Istio's delta ADS client asks for a load
// assignment by name for as long as its stream lasts. While it holds the cluster, they stay.
func TestARemovedClustersEndpointsAreRemovedOnceTheDeltaClientNoLongerHoldsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		h := newGuardedServer(t, Options{})
		h.set(map[resource.Type][]types.Resource{
			resource.ClusterType:  {eds("y"), eds("z")},
			resource.EndpointType: {endpointsOf("y", 80), endpointsOf("z", 80)}})
		c := h.delta()
		c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})
		c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{"y", "z"}})
		rs := answerDelta(c)
		g.Expect(deltaResourceNames(ofType(rs, resource.EndpointType)[0])).To(ConsistOf("y", "z"))

		// y goes, cluster and endpoints; z's endpoints change.
		h.set(map[resource.Type][]types.Resource{
			resource.ClusterType:  {eds("z")},
			resource.EndpointType: {endpointsOf("z", 81)}})
		rs = answerDelta(c)
		var removedClusters, removedEndpoints []string
		for _, r := range ofType(rs, resource.ClusterType) {
			removedClusters = append(removedClusters, r.GetRemovedResources()...)
		}
		for _, r := range ofType(rs, resource.EndpointType) {
			removedEndpoints = append(removedEndpoints, r.GetRemovedResources()...)
		}
		g.Expect(removedClusters).To(Equal([]string{"y"}))
		g.Expect(removedEndpoints).To(Equal([]string{"y"}), "the client no longer holds cluster y: its endpoints go")
		g.Expect(withheldOf(h.g, resource.EndpointType)).To(BeEmpty())
		last := ofType(rs, resource.EndpointType)
		g.Expect(last[len(last)-1].GetRemovedResources()).To(Equal([]string{"y"}), "after the update of z")
	})
}

// The same for a SotW client that keeps asking for a removed cluster's endpoints: a SotW
// response of load assignments cannot remove one, but the guard no longer holds the old one as
// the client's, so a response of every name it asks for (it asks for one more) does not bring
// the removed endpoints back.
func TestARemovedClustersEndpointsAreNotSentAgainToASotwClientThatStillAsks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		h := newGuardedServer(t, Options{})
		h.set(map[resource.Type][]types.Resource{
			resource.ClusterType:  {eds("y"), eds("z")},
			resource.EndpointType: {endpointsOf("y", 80), endpointsOf("z", 80)}})
		c := newSotwClient(h.sotw())
		c.ask(resource.ClusterType)
		c.ask(resource.EndpointType, "y", "z")
		c.answer()

		h.set(map[resource.Type][]types.Resource{
			resource.ClusterType:  {eds("w"), eds("z")},
			resource.EndpointType: {endpointsOf("w", 80), endpointsOf("z", 81)}})
		c.answer()
		g.Expect(withheldOf(h.g, resource.EndpointType)).To(BeEmpty(), "y is not kept for the client")

		c.ask(resource.EndpointType, "w", "y", "z")
		rs := ofType(c.answer(), resource.EndpointType)
		g.Expect(rs).NotTo(BeEmpty())
		var sent []string
		for _, a := range rs[len(rs)-1].GetResources() {
			var cla endpoint.ClusterLoadAssignment
			g.Expect(a.UnmarshalTo(&cla)).To(Succeed())
			sent = append(sent, cla.GetClusterName())
		}
		slices.Sort(sent)
		g.Expect(sent).To(Equal([]string{"w", "z"}), "the removed cluster's endpoints are not sent again")
	})
}

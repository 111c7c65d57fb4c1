package guard_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/guard"
)

func routeTo(clusters ...string) *route.RouteConfiguration {
	vh := &route.VirtualHost{Name: "vh", Domains: []string{"*"}}
	for _, c := range clusters {
		vh.Routes = append(vh.Routes, &route.Route{Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
			Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: c}}}})
	}
	return &route.RouteConfiguration{Name: "r", VirtualHosts: []*route.VirtualHost{vh}}
}

func (h *sotw) setAll(rc *route.RouteConfiguration, clusters ...types.Resource) {
	h.t.Helper()
	h.v++
	s, err := cache.NewSnapshot(strconv.Itoa(h.v), map[resource.Type][]types.Resource{
		resource.RouteType: {rc}, resource.ClusterType: clusters})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.snap.SetSnapshot(context.Background(), "client", s); err != nil {
		h.t.Fatal(err)
	}
}

// byName is a client that asks for clusters by name, as grpc-go does: the clusters its route
// configuration names. It ACKs everything but clusters with lb_policy MAGLEV, which it NACKs
// naming them as grpc-go does.
type byName struct {
	h        *sotw
	acked    map[string]string // type -> version
	route    *route.RouteConfiguration
	clusters map[string]*cluster.Cluster
	asked    []string // the clusters asked for
	keep     []string // clusters asked for besides the route's (grpc-go's, while RPCs use them)
	routes   []*route.RouteConfiguration
	got      []string // the clusters of the last response
}

func (c *byName) handle(r *discovery.DiscoveryResponse) {
	switch r.GetTypeUrl() {
	case resource.RouteType:
		var rc route.RouteConfiguration
		if err := r.GetResources()[0].UnmarshalTo(&rc); err != nil {
			c.h.t.Fatal(err)
		}
		c.route = &rc
		c.routes = append(c.routes, &rc)
		c.answer(r, "")
		var want []string
		for _, rt := range rc.GetVirtualHosts()[0].GetRoutes() {
			want = append(want, rt.GetRoute().GetCluster())
		}
		for _, k := range c.keep {
			if !slices.Contains(want, k) {
				want = append(want, k)
			}
		}
		if strconv.Quote(want[len(want)-1]) != strconv.Quote(lastOf(c.asked)) || len(want) != len(c.asked) {
			c.asked = want
			c.h.stream.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType, ResourceNames: want, VersionInfo: c.acked[resource.ClusterType]})
		}
	case resource.ClusterType:
		refused := ""
		c.got = nil
		for _, a := range r.GetResources() {
			var cl cluster.Cluster
			if err := a.UnmarshalTo(&cl); err != nil {
				c.h.t.Fatal(err)
			}
			c.got = append(c.got, cl.GetName())
			if cl.GetLbPolicy() == cluster.Cluster_MAGLEV {
				refused = cl.GetName()
			} else {
				c.clusters[cl.GetName()] = &cl
			}
		}
		c.answer(r, refused)
	}
}

func lastOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

func (c *byName) answer(r *discovery.DiscoveryResponse, refused string) {
	req := &discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()}
	if r.GetTypeUrl() == resource.ClusterType {
		req.ResourceNames = c.asked
	} else {
		req.ResourceNames = []string{"r"}
	}
	if refused != "" {
		req.VersionInfo = c.acked[r.GetTypeUrl()]
		req.ErrorDetail = &rpcstatus.Status{Code: 3, Message: `error parsing "ClusterResource" response: resource "` + refused + `": unsupported lb policy MAGLEV`}
	} else {
		req.VersionInfo = r.GetVersionInfo()
		c.acked[r.GetTypeUrl()] = r.GetVersionInfo()
	}
	if err := c.h.stream.Send(req); err != nil {
		c.h.t.Fatal(err)
	}
}

// run handles responses for d; runUntil until done holds after one, or d passes.
func (c *byName) run(d time.Duration)                        { c.h.answer(c.handle, never, d) }
func (c *byName) runUntil(done func() bool, d time.Duration) { c.h.answer(c.handle, done, d) }

// answer hands each response the client gets to handle, until done holds after one, or d passes.
func (h *sotw) answer(handle func(*discovery.DiscoveryResponse), done func() bool, d time.Duration) {
	end := time.After(d)
	for !done() {
		select {
		case r := <-h.in:
			handle(r)
		case <-end:
			return
		}
	}
}

func never() bool { return false }

func routesTo(rc *route.RouteConfiguration) (plain, warmUp []string) {
	for _, rt := range rc.GetVirtualHosts()[0].GetRoutes() {
		if len(rt.GetMatch().GetHeaders()) > 0 {
			warmUp = append(warmUp, rt.GetRoute().GetCluster())
		} else {
			plain = append(plain, rt.GetRoute().GetCluster())
		}
	}
	return plain, warmUp
}

// routedToC1 is a guarded client that asks for clusters by name (byName), which holds route
// configuration "r" to cluster c1, and c1.
func routedToC1(t *testing.T) (*sotw, *byName) {
	h := newSotw(t, true)
	c := &byName{h: h, acked: map[string]string{}, clusters: map[string]*cluster.Cluster{}}
	h.setAll(routeTo("c1"), edsCluster("c1", cluster.Cluster_ROUND_ROBIN))
	h.stream.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.RouteType, ResourceNames: []string{"r"}})
	c.runUntil(func() bool { _, ok := c.clusters["c1"]; return ok }, 10*time.Second)
	c.run(200 * time.Millisecond) // and whatever follows it
	return h, c
}

// Make-before-break for a client that asks for clusters by name once a route names them: a
// route configuration switched to a new cluster is withheld until the client has accepted the
// cluster; meanwhile the client keeps its route configuration, with a route that matches no
// request (guard.WarmUpHeader) to the new cluster so that it asks for it. A cluster it refuses
// keeps the new route back, with the reason; new content of the cluster releases it.
func TestARouteWaitsUntilTheClientAcceptedItsNewCluster(t *testing.T) {
	g := NewWithT(t)
	h, c := routedToC1(t)
	g.Expect(c.clusters).To(HaveKey("c1"))
	g.Expect(c.asked).To(Equal([]string{"c1"}))

	// Switched to c2, which the client refuses.
	h.setAll(routeTo("c2"), edsCluster("c1", cluster.Cluster_ROUND_ROBIN), edsCluster("c2", cluster.Cluster_MAGLEV))
	c.run(time.Second)
	plain, warm := routesTo(c.route)
	g.Expect(plain).To(Equal([]string{"c1"}), "the client keeps routing to c1")
	g.Expect(warm).To(Equal([]string{"c2"}), "and asks for c2")
	g.Expect(c.asked).To(ContainElement("c2"))
	for _, rc := range c.routes {
		p, _ := routesTo(rc)
		g.Expect(p).NotTo(ContainElement("c2"), "no route configuration sent traffic to the refused cluster")
	}
	var withheld []guard.Withheld
	for _, ti := range h.guard.Clients()[0].Types {
		if ti.TypeURL == resource.RouteType {
			withheld = ti.Withheld
		}
	}
	g.Expect(withheld).To(ConsistOf(HaveField("Name", "r")))
	g.Expect(withheld[0].Reason).To(And(ContainSubstring(`Cluster "c2"`), ContainSubstring("unsupported lb policy MAGLEV")))

	// c2 fixed: accepted, then the route goes.
	h.setAll(routeTo("c2"), edsCluster("c1", cluster.Cluster_ROUND_ROBIN), edsCluster("c2", cluster.Cluster_ROUND_ROBIN))
	c.runUntil(func() bool { p, _ := routesTo(c.route); return slices.Equal(p, []string{"c2"}) }, 10*time.Second)
	g.Expect(c.clusters).To(HaveKey("c2"))
	plain, warm = routesTo(c.route)
	g.Expect(plain).To(Equal([]string{"c2"}))
	g.Expect(warm).To(BeEmpty())
}

// A cluster the cache no longer serves stays while the client asks for it by name, though no
// route it holds names it: grpc-go asks for a cluster until its last RPC on it is done, and
// fails that RPC if the cluster goes first. Once the client stops asking, it is gone.
func TestARemovedClusterStaysWhileTheClientAsksForIt(t *testing.T) {
	g := NewWithT(t)
	h, c := routedToC1(t)

	c.keep = []string{"c1"} // an RPC on c1 runs on
	h.setAll(routeTo("c2"), edsCluster("c2", cluster.Cluster_ROUND_ROBIN))
	c.runUntil(func() bool { p, _ := routesTo(c.route); return slices.Equal(p, []string{"c2"}) }, 10*time.Second)
	c.run(300 * time.Millisecond)
	g.Expect(c.asked).To(ConsistOf("c1", "c2"))
	g.Expect(c.got).To(ConsistOf("c1", "c2"), "c1 is asked for: it stays")
	var withheld []guard.Withheld
	for _, ti := range h.guard.Clients()[0].Types {
		if ti.TypeURL == resource.ClusterType {
			withheld = ti.Withheld
		}
	}
	g.Expect(withheld).To(ConsistOf(And(HaveField("Name", "c1"), HaveField("Reason", "removed, kept while the client asks for it"))))

	c.keep, c.asked = nil, []string{"c2"} // the RPC is done
	g.Expect(h.stream.Send(&discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType, ResourceNames: c.asked, VersionInfo: c.acked[resource.ClusterType]})).To(Succeed())
	c.runUntil(func() bool { return slices.Equal(c.got, []string{"c2"}) }, 10*time.Second)
	g.Expect(c.got).To(Equal([]string{"c2"}), "no longer asked for: gone")
}

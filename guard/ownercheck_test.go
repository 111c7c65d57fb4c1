package guard_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// envoyLike is a client that asks for every cluster (CDS wildcard) and the route configuration
// "r", as Envoy does, and refuses clusters with lb_policy MAGLEV.
type envoyLike struct {
	h      *sotw
	route  *route.RouteConfiguration
	routes []*route.RouteConfiguration
	acked  map[string]string
}

func (c *envoyLike) start() {
	for _, typeURL := range []string{resource.ClusterType, resource.RouteType} {
		req := &discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: typeURL}
		if typeURL == resource.RouteType {
			req.ResourceNames = []string{"r"}
		}
		if err := c.h.stream.Send(req); err != nil {
			c.h.t.Fatal(err)
		}
	}
}

func (c *envoyLike) run(d time.Duration) { c.h.answer(c.handle, never, d) }

func (c *envoyLike) runUntil(done func() bool, d time.Duration) { c.h.answer(c.handle, done, d) }

// handle answers one response: it ACKs, or NACKs a cluster with lb_policy MAGLEV.
func (c *envoyLike) handle(r *discovery.DiscoveryResponse) {
	req := &discovery.DiscoveryRequest{Node: nodeOf("client"), TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}
	switch r.GetTypeUrl() {
	case resource.RouteType:
		req.ResourceNames = []string{"r"}
		for _, a := range r.GetResources() {
			var rc route.RouteConfiguration
			if err := a.UnmarshalTo(&rc); err != nil {
				c.h.t.Fatal(err)
			}
			c.route = &rc
			c.routes = append(c.routes, &rc)
		}
	case resource.ClusterType:
		for _, a := range r.GetResources() {
			var cl cluster.Cluster
			if err := a.UnmarshalTo(&cl); err != nil {
				c.h.t.Fatal(err)
			}
			if cl.GetLbPolicy() == cluster.Cluster_MAGLEV {
				req.VersionInfo = c.acked[r.GetTypeUrl()]
				req.ErrorDetail = &rpcstatus.Status{Code: 3, Message: `resource "` + cl.GetName() + `": unsupported lb policy MAGLEV`}
			}
		}
	}
	if req.ErrorDetail == nil {
		c.acked[r.GetTypeUrl()] = r.GetVersionInfo()
	}
	if err := c.h.stream.Send(req); err != nil {
		c.h.t.Fatal(err)
	}
}

func staticCluster(name string, lb cluster.Cluster_LbPolicy) *cluster.Cluster {
	return &cluster.Cluster{Name: name, LbPolicy: lb, ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}}
}

// Owner holds through kds-host's OwnerCheck (the reference plugin's own library, here with the
// guard's own holds off): a route switched to a cluster the client refuses waits, with the
// plugin's reason, and goes once the client has the cluster.
func TestAnOwnerCheckPluginHoldsARouteUntilItsClusterIsAccepted(t *testing.T) {
	g := NewWithT(t)
	h := newSotwWith(t, &guard.Options{NoHolds: true, OwnerCheck: func() shared.OwnerCheck { return ownerpredict.New() }})
	c := &envoyLike{h: h, acked: map[string]string{}}
	h.setAll(routeTo("c1"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN))
	c.start()
	c.runUntil(func() bool { return c.route != nil }, 10*time.Second) // the first owner check, on a busy machine
	g.Expect(c.route).NotTo(BeNil())
	plain, _ := routesTo(c.route)
	g.Expect(plain).To(Equal([]string{"c1"}))

	h.setAll(routeTo("c2"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN), staticCluster("c2", cluster.Cluster_MAGLEV))
	c.run(time.Second)
	for _, rc := range c.routes {
		p, _ := routesTo(rc)
		g.Expect(p).NotTo(ContainElement("c2"), "no route to the refused cluster reached the client")
	}
	var w []guard.Withheld
	for _, ti := range h.guard.Clients()[0].Types {
		if ti.TypeURL == resource.RouteType {
			w = ti.Withheld
		}
	}
	g.Expect(w).To(ConsistOf(HaveField("Reason", And(HavePrefix("owner check: waiting for"), ContainSubstring("c2")))))

	h.setAll(routeTo("c2"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN), staticCluster("c2", cluster.Cluster_ROUND_ROBIN))
	c.runUntil(func() bool { p, _ := routesTo(c.route); return slices.Equal(p, []string{"c2"}) }, 10*time.Second)
	plain, _ = routesTo(c.route)
	g.Expect(plain).To(Equal([]string{"c2"}), "the route goes once the client has its cluster")
}

// failing is an OwnerCheck that always fails.
type failing struct{ shared.OwnerCheck }

func (failing) Predict(context.Context, *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	return nil, errors.New("down")
}

func (failing) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return nil, errors.New("down")
}

// An owner check that fails lets everything through (fail-open), as kds-host's does.
func TestAFailingOwnerCheckFailsOpen(t *testing.T) {
	g := NewWithT(t)
	h := newSotwWith(t, &guard.Options{NoHolds: true, OwnerCheck: func() shared.OwnerCheck { return failing{} }})
	c := &envoyLike{h: h, acked: map[string]string{}}
	h.setAll(routeTo("c9"), staticCluster("c1", cluster.Cluster_ROUND_ROBIN))
	c.start()
	c.runUntil(func() bool { return c.route != nil }, 10*time.Second)
	g.Expect(c.route).NotTo(BeNil())
	plain, _ := routesTo(c.route)
	g.Expect(plain).To(Equal([]string{"c9"}))
}

package guard

import (
	"slices"
	"strings"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// WarmUpHeader is the header that the routes the guard adds to warm clusters up match on. No
// request carries it: the routes only make a client that asks for clusters by name (grpc-go) ask
// for the clusters a new version of the route configuration will send to, before it gets it.
const WarmUpHeader = "x-kds-host-warm-up"

// warmUpRoute is a route to cluster that matches no request: it needs WarmUpHeader.
func warmUpRoute(cluster string) *route.Route {
	return &route.Route{
		Match: &route.RouteMatch{
			PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""},
			Headers: []*route.HeaderMatcher{{Name: WarmUpHeader,
				HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: &matcher.StringMatcher{
					MatchPattern: &matcher.StringMatcher_Exact{Exact: "warm-up"}}}}},
		},
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster}}},
	}
}

// warmedUp is the route configuration encoded in a, with a route to each of clusters that
// matches no request appended to every virtual host; nil when a is not one.
func warmedUp(a *anypb.Any, clusters []string) *route.RouteConfiguration {
	m, err := a.UnmarshalNew()
	rc, ok := m.(*route.RouteConfiguration)
	if err != nil || !ok {
		return nil
	}
	rc = proto.Clone(rc).(*route.RouteConfiguration)
	for _, vh := range rc.GetVirtualHosts() {
		for _, c := range clusters {
			vh.Routes = append(vh.Routes, warmUpRoute(c))
		}
	}
	return rc
}

// warmLocked is the route configuration the client holds (from), with a route to each of
// clusters that matches no request (it needs WarmUpHeader), appended to every virtual host: the
// client keeps routing as before, and asks for the clusters. Call with s.mu.
func (s *session) warmLocked(ts *typeState, from *item, clusters []string) *item {
	clusters = slices.DeleteFunc(slices.Clone(clusters), func(c string) bool {
		return slices.Contains(from.refs, Ref{TypeURL: resource.ClusterType, Name: c})
	})
	if len(clusters) == 0 {
		return from // it names them already
	}
	key := strings.Join(clusters, ",")
	if w, ok := ts.warm[from.name]; ok && w.from == from && w.clusters == key {
		return w.it
	}
	rc := warmedUp(from.any, clusters)
	if rc == nil {
		return from
	}
	a, err := anypb.New(rc)
	if err != nil {
		return from
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(rc)
	if err == nil {
		a.Value = b
	}
	it, err := s.g.items.of(ts.typeURL, a, rc, s.g.owners)
	if err != nil {
		return from
	}
	ts.warm[from.name] = warmed{from: from, clusters: key, it: it}
	return it
}

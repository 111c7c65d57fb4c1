package guard

import (
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
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

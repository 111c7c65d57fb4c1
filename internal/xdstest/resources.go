package xdstest

import (
	"fmt"
	"net"
	"strconv"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Names used by the scenarios: the client dials Target, whose authority-less endpoint ListenerName
// is the API listener's name.
const (
	Target       = "xds:///svc"
	ListenerName = "svc"
	RouteName    = "svc-route"
	NodeID       = "xdstest-client"
)

// Type URLs, short names for resource.*Type.
const (
	ListenerType = resource.ListenerType
	RouteType    = resource.RouteType
	ClusterType  = resource.ClusterType
	EndpointType = resource.EndpointType
)

// AllTypes are the four types the client uses, in LDS, RDS, CDS, EDS order.
var AllTypes = []string{ListenerType, RouteType, ClusterType, EndpointType}

func ads() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// APIListener is the listener grpc-go asks for when it dials xds:///name: an api_listener holding an
// HttpConnectionManager that takes routeName over RDS (ADS) and has the router filter.
func APIListener(name, routeName string) *listener.Listener {
	rt, err := anypb.New(&router.Router{})
	if err != nil {
		panic(err)
	}
	m := &hcm.HttpConnectionManager{
		CodecType:  hcm.HttpConnectionManager_AUTO,
		StatPrefix: "http",
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    ads(),
			RouteConfigName: routeName,
		}},
		HttpFilters: []*hcm.HttpFilter{{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: rt},
		}},
	}
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return &listener.Listener{Name: name, ApiListener: &listener.ApiListener{ApiListener: a}}
}

// Route is one route of a RouteConfig: prefix "" to Cluster, or, if Header is set, only the RPCs
// whose metadata has Header (present match): RPCs of the loop never carry it.
type Route struct {
	Cluster string
	Header  string
}

// RouteConfig is a RouteConfiguration with one virtual host (domains ["*"]) holding routes in order.
// With no routes given it has one: prefix "" to nothing (use RouteTo).
func RouteConfig(name string, routes ...Route) *route.RouteConfiguration {
	vh := &route.VirtualHost{Name: "vh", Domains: []string{"*"}}
	for _, r := range routes {
		m := &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}}
		if r.Header != "" {
			m.Headers = []*route.HeaderMatcher{{
				Name:                 r.Header,
				HeaderMatchSpecifier: &route.HeaderMatcher_PresentMatch{PresentMatch: true},
			}}
		}
		vh.Routes = append(vh.Routes, &route.Route{
			Match: m,
			Action: &route.Route_Route{Route: &route.RouteAction{
				ClusterSpecifier: &route.RouteAction_Cluster{Cluster: r.Cluster},
			}},
		})
	}
	return &route.RouteConfiguration{Name: name, VirtualHosts: []*route.VirtualHost{vh}}
}

// RouteTo is RouteConfig(name) with the one route prefix "" to cluster.
func RouteTo(name, cluster string) *route.RouteConfiguration {
	return RouteConfig(name, Route{Cluster: cluster})
}

// ClusterOption changes a cluster built by Cluster.
type ClusterOption func(*cluster.Cluster)

// Maglev sets lb_policy MAGLEV, which grpc-go refuses (NACKs the CDS response).
func Maglev() ClusterOption {
	return func(c *cluster.Cluster) { c.LbPolicy = cluster.Cluster_MAGLEV }
}

// Cluster is an EDS cluster (endpoints over ADS, service name = cluster name), lb ROUND_ROBIN.
func Cluster(name string, opts ...ClusterOption) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ConnectTimeout:       durationpb.New(s5),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Endpoints is a ClusterLoadAssignment for cluster: one locality holding addrs ("127.0.0.1:port").
func Endpoints(cluster string, addrs ...string) *endpoint.ClusterLoadAssignment {
	var lbs []*endpoint.LbEndpoint
	for _, a := range addrs {
		host, p, err := net.SplitHostPort(a)
		if err != nil {
			panic(fmt.Sprintf("xdstest: endpoint %q: %v", a, err))
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			panic(fmt.Sprintf("xdstest: endpoint %q: %v", a, err))
		}
		lbs = append(lbs, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Protocol:      core.SocketAddress_TCP,
					Address:       host,
					PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(port)},
				}}},
			}},
		})
	}
	return &endpoint.ClusterLoadAssignment{
		ClusterName: cluster,
		Endpoints: []*endpoint.LocalityLbEndpoints{{
			Locality:            &core.Locality{Region: "local"},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(1), // grpc-go drops a locality without weight
		}},
	}
}

// Resources is a full state of the world, per type URL, as Server.Set takes it.
type Resources = map[string][]types.Resource

// State builds Resources from a listener/route pair and any clusters and assignments.
func State(routes *route.RouteConfiguration, clusters []*cluster.Cluster, clas ...*endpoint.ClusterLoadAssignment) Resources {
	r := Resources{
		ListenerType: {APIListener(ListenerName, routes.GetName())},
		RouteType:    {routes},
	}
	for _, c := range clusters {
		r[ClusterType] = append(r[ClusterType], c)
	}
	for _, e := range clas {
		r[EndpointType] = append(r[EndpointType], e)
	}
	return r
}

package guard_test

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/guard"
)

func anyOf(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func tlsSocket(t *testing.T, m proto.Message) *core.TransportSocket {
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: anyOf(t, m)}}
}

// What each Envoy resource references, for make-before-break: a listener's route configuration
// (API listener or filter chain) and SDS secrets, a route's clusters (weighted too, once each), a
// cluster's load assignment (EDS) and SDS secrets.
func TestEnvoyReferences(t *testing.T) {
	g := NewWithT(t)
	rds := &hcm.HttpConnectionManager{RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{RouteConfigName: "routes"}}}
	common := &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: "cert"}},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: "ca"}}},
	}
	for _, tc := range []struct {
		name string
		r    guard.Resource
		want []guard.Ref
	}{
		{"an API listener", &listener.Listener{Name: "l", ApiListener: &listener.ApiListener{ApiListener: anyOf(t, rds)}},
			[]guard.Ref{{TypeURL: resource.RouteType, Name: "routes"}}},
		{"a filter chain with TLS", &listener.Listener{Name: "l", FilterChains: []*listener.FilterChain{{
			Filters:         []*listener.Filter{{Name: "hcm", ConfigType: &listener.Filter_TypedConfig{TypedConfig: anyOf(t, rds)}}},
			TransportSocket: tlsSocket(t, &tlsv3.DownstreamTlsContext{CommonTlsContext: common}),
		}}}, []guard.Ref{{TypeURL: resource.RouteType, Name: "routes"}, {TypeURL: resource.SecretType, Name: "cert"}, {TypeURL: resource.SecretType, Name: "ca"}}},
		{"a route with weighted clusters", &route.RouteConfiguration{Name: "r", VirtualHosts: []*route.VirtualHost{{Routes: []*route.Route{
			{Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: "a"}}}},
			{Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_WeightedClusters{WeightedClusters: &route.WeightedCluster{
				Clusters: []*route.WeightedCluster_ClusterWeight{{Name: "a"}, {Name: "b"}}}}}}},
		}}}}, []guard.Ref{{TypeURL: resource.ClusterType, Name: "a"}, {TypeURL: resource.ClusterType, Name: "b"}}},
		{"an EDS cluster with a service name, and TLS", &cluster.Cluster{Name: "c", ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
			EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{ServiceName: "svc"},
			TransportSocket:  tlsSocket(t, &tlsv3.UpstreamTlsContext{CommonTlsContext: common})},
			[]guard.Ref{{TypeURL: resource.EndpointType, Name: "svc"}, {TypeURL: resource.SecretType, Name: "cert"}, {TypeURL: resource.SecretType, Name: "ca"}}},
		{"a static cluster", &cluster.Cluster{Name: "c", ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}}, nil},
	} {
		g.Expect(guard.EnvoyReferences("", tc.r)).To(Equal(tc.want), tc.name)
	}
}

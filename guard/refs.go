package guard

import (
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// EnvoyReferences is the reference owner policy for Envoy's resources: what a resource needs the
// client to have accepted before it may go (make-before-break):
//   - a Listener: the route configuration its HTTP connection manager names (RDS), whether an
//     API listener (proxyless gRPC) or a filter chain's, and the SDS secrets its filter chains'
//     TLS contexts name;
//   - a RouteConfiguration: the clusters its routes send to (one, or weighted), and, through
//     each, the cluster's own references: a route waits until the client has the cluster and
//     its endpoints;
//   - a Cluster: its load assignment when it is EDS (eds_cluster_config.service_name, else its
//     name), and the SDS secrets its TLS context names;
//   - other types: nothing.
//
// A reference the client does not ask for is not waited for, unless the guard can make the
// client ask for it (a route's new cluster, see WarmUpHeader): a client asks for a cluster's
// load assignment only once it has the cluster, so a new cluster is sent at once.
func EnvoyReferences(typeURL string, r Resource) []Ref {
	switch m := r.(type) {
	case *listener.Listener:
		var out []Ref
		add := func(h *hcm.HttpConnectionManager) {
			if name := h.GetRds().GetRouteConfigName(); name != "" {
				out = append(out, Ref{TypeURL: resource.RouteType, Name: name})
			}
		}
		if a := m.GetApiListener().GetApiListener(); a != nil {
			var h hcm.HttpConnectionManager
			if a.UnmarshalTo(&h) == nil {
				add(&h)
			}
		}
		for _, fc := range m.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var h hcm.HttpConnectionManager
				if tc := f.GetTypedConfig(); tc != nil && tc.UnmarshalTo(&h) == nil {
					add(&h)
				}
			}
			var tls tlsv3.DownstreamTlsContext
			if tc := fc.GetTransportSocket().GetTypedConfig(); tc != nil && tc.UnmarshalTo(&tls) == nil {
				out = appendSecrets(out, tls.GetCommonTlsContext())
			}
		}
		return out
	case *route.RouteConfiguration:
		seen := map[string]bool{}
		var out []Ref
		add := func(name string) {
			if name != "" && !seen[name] {
				seen[name] = true
				out = append(out, Ref{TypeURL: resource.ClusterType, Name: name})
			}
		}
		for _, vh := range m.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				a := rt.GetRoute()
				add(a.GetCluster())
				for _, wc := range a.GetWeightedClusters().GetClusters() {
					add(wc.GetName())
				}
			}
		}
		return out
	case *cluster.Cluster:
		var out []Ref
		if m.GetType() == cluster.Cluster_EDS {
			name := m.GetEdsClusterConfig().GetServiceName()
			if name == "" {
				name = m.GetName()
			}
			out = append(out, Ref{TypeURL: resource.EndpointType, Name: name})
		}
		var tls tlsv3.UpstreamTlsContext
		if tc := m.GetTransportSocket().GetTypedConfig(); tc != nil && tc.UnmarshalTo(&tls) == nil {
			out = appendSecrets(out, tls.GetCommonTlsContext())
		}
		return out
	}
	return nil
}

// appendSecrets adds the SDS secrets a TLS context names: its certificates and its validation
// context (plain or combined).
func appendSecrets(out []Ref, c *tlsv3.CommonTlsContext) []Ref {
	add := func(s *tlsv3.SdsSecretConfig) {
		if name := s.GetName(); name != "" && !slices.Contains(out, Ref{TypeURL: resource.SecretType, Name: name}) {
			out = append(out, Ref{TypeURL: resource.SecretType, Name: name})
		}
	}
	for _, s := range c.GetTlsCertificateSdsSecretConfigs() {
		add(s)
	}
	add(c.GetValidationContextSdsSecretConfig())
	add(c.GetCombinedValidationContext().GetValidationContextSdsSecretConfig())
	return out
}

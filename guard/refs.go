package guard

import (
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// EnvoyReferences is the reference owner policy for Envoy's resources: what a resource needs the
// client to have accepted before it may go (make-before-break):
//   - a Listener: the route configuration its HTTP connection manager names (RDS), whether an
//     API listener (proxyless gRPC) or a filter chain's;
//   - a RouteConfiguration: the clusters its routes send to (one, or weighted);
//   - other types: nothing.
//
// A reference the client does not ask for is not waited for: a client that asks for a cluster
// only once a route names it (grpc-go) gets the route. An EDS cluster's load assignment is not
// waited for either: clients ask for it once they have the cluster, and warm the cluster
// themselves until it comes.
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
		return nil
	}
	return nil
}

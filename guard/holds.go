package guard

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine"
)

// envoyHolds is an engine.Withholder over the entries' Refs (EnvoyReferences):
//   - a resource waits for what it references that the client asks for and has not accepted (a
//     route configuration also for its clusters' endpoints);
//   - a route configuration that sends to a cluster the client does not ask for yet goes as the
//     version the client holds with a warm-up route to it (WarmUpHeader);
//   - a name no longer served is kept while something the client holds references it, and a
//     cluster also while the client asks for it by name.
type envoyHolds struct {
	mu   sync.Mutex                // guards warm
	warm map[warmKey]*engine.Entry // warm-up versions made, by what they were made of
}

type warmKey struct{ from, clusters string }

func (h *envoyHolds) Withhold(c engine.ClientView, e *engine.Entry) (string, *engine.Entry) {
	var waiting, warm []string
	for _, ref := range e.Refs {
		asksType := c.AsksType(ref.TypeURL)
		if _, ok := c.Holds(ref.TypeURL, ref.Name); ok && asksType {
			if e.TypeURL == resource.RouteType {
				waiting = append(waiting, pendingRefs(c, ref)...)
			}
			continue
		}
		what := fmt.Sprintf("%s %q", shortType(ref.TypeURL), ref.Name)
		if reason, ok := c.Refused(ref.TypeURL, ref.Name); ok {
			what += " (it refused it: " + reason + ")"
		}
		_, holdsRoute := c.Holds(e.TypeURL, e.Name)
		switch {
		case asksType && c.Asks(ref.TypeURL, ref.Name):
			waiting = append(waiting, what)
		case asksType && e.TypeURL == resource.RouteType && ref.TypeURL == resource.ClusterType && holdsRoute:
			waiting = append(waiting, what)
			warm = append(warm, ref.Name)
		}
	}
	if len(waiting) == 0 {
		return "", nil
	}
	why := "waiting for the client to accept " + strings.Join(waiting, ", ")
	if len(warm) == 0 {
		return why, nil
	}
	return why, h.warmUp(c.HeldEntry(e.TypeURL, e.Name), warm)
}

// pendingRefs names what the accepted resource ref references that the server serves and the
// client, which asks for the type, has not accepted yet.
func pendingRefs(c engine.ClientView, ref engine.Ref) []string {
	held := c.HeldEntry(ref.TypeURL, ref.Name)
	if held == nil {
		return nil
	}
	var out []string
	for _, r := range held.Refs {
		if _, ok := c.Holds(r.TypeURL, r.Name); c.AsksType(r.TypeURL) && !ok && c.Served(r.TypeURL, r.Name) != nil {
			out = append(out, fmt.Sprintf("%s %q", shortType(r.TypeURL), r.Name))
		}
	}
	return out
}

func (h *envoyHolds) Keep(c engine.ClientView, typeURL, name string) string {
	if by := c.ReferencedBy(typeURL, name); by != "" {
		return "removed, kept while the client holds " + by + ", which references it"
	}
	if typeURL == resource.ClusterType && c.Asks(typeURL, name) && !c.AsksAll(typeURL) {
		return "removed, kept while the client asks for it"
	}
	return ""
}

// warmUp is from (the route configuration the client holds) with a warm-up route to each of
// clusters appended to every virtual host; nil when from is nil or names them all already.
func (h *envoyHolds) warmUp(from *engine.Entry, clusters []string) *engine.Entry {
	if from == nil {
		return nil
	}
	clusters = slices.DeleteFunc(slices.Clone(clusters), func(c string) bool {
		return slices.Contains(from.Refs, engine.Ref{TypeURL: resource.ClusterType, Name: c})
	})
	if len(clusters) == 0 {
		return nil
	}
	key := warmKey{from: from.Name + "@" + from.Version, clusters: strings.Join(clusters, ",")}
	h.mu.Lock()
	defer h.mu.Unlock()
	if w, ok := h.warm[key]; ok {
		return w
	}
	m, err := from.Any.UnmarshalNew()
	rc, ok := m.(*route.RouteConfiguration)
	if err != nil || !ok {
		return nil
	}
	for _, vh := range rc.GetVirtualHosts() {
		for _, c := range clusters {
			vh.Routes = append(vh.Routes, warmUpRoute(c))
		}
	}
	a, version, err := encode(resource.RouteType, rc)
	if err != nil {
		return nil
	}
	e, err := newEntry(resource.RouteType, from.Name, version, a, refsOf(EnvoyReferences(resource.RouteType, rc)), from.Source)
	if err != nil {
		return nil
	}
	if len(h.warm) > 1024 { // made per client and route; old ones are not asked for again
		clear(h.warm)
	}
	h.warm[key] = e
	return e
}

// encode is r's encoding and its version (versionOf); a resource without a name is refused.
func encode(typeURL string, r Resource) (*anypb.Any, string, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, r, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, "", fmt.Errorf("guard: encode a %s: %w", shortType(typeURL), err)
	}
	if cache.GetResourceName(r) == "" {
		return nil, "", fmt.Errorf("guard: a %s without a name", shortType(typeURL))
	}
	return a, versionOf(a), nil
}

// newEntry is the engine's entry of one version, encoded once for every client (the codec).
func newEntry(typeURL, name, version string, a *anypb.Any, refs []engine.Ref, source any) (*engine.Entry, error) {
	e := &engine.Entry{TypeURL: typeURL, Name: name, Version: version, Any: a, Source: source, Refs: refs,
		Wire: &discovery.Resource{Name: name, Version: version, Resource: a}}
	if err := e.EncodeWire(); err != nil {
		return nil, fmt.Errorf("guard: encode a %s: %w", shortType(typeURL), err)
	}
	return e, nil
}

// refsOf is refs as the engine's.
func refsOf(refs []Ref) []engine.Ref {
	var out []engine.Ref
	for _, r := range refs {
		out = append(out, engine.Ref(r))
	}
	return out
}

// shortType is a type URL's last part (Cluster), as messages name it.
func shortType(typeURL string) string {
	if i := strings.LastIndexByte(typeURL, '.'); i >= 0 {
		return typeURL[i+1:]
	}
	return typeURL
}

// WarmUpHeader is the header that the routes the guard adds to warm clusters up match on. No
// request carries it: the routes make a client that asks for clusters by name (grpc-go) ask for
// those a new version of its route configuration sends to, before it gets it.
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

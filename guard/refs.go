package guard

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// EnvoyReferences is the reference owner policy for Envoy's resources: what a resource needs the
// client to have accepted before it may go (make-before-break):
//   - a Listener: the route configuration its HTTP connection managers name (RDS), API listener
//     or filter chain's, and the SDS secrets its filter chains' TLS contexts name;
//   - a RouteConfiguration: the clusters its routes send to (one, or weighted), and their own
//     references (a route waits until the client has the cluster and its endpoints);
//   - a Cluster: its load assignment when it is EDS (eds_cluster_config.service_name, else its
//     name), and the SDS secrets its TLS context names;
//   - other types: nothing.
//
// A reference the client does not ask for is not waited for, unless the guard can make the
// client ask for it (a route's new cluster, see WarmUpHeader).
func EnvoyReferences(typeURL string, r Resource) []Ref {
	switch m := r.(type) {
	case *listener.Listener:
		var out []Ref
		rds := func(tc *anypb.Any) {
			var h hcm.HttpConnectionManager
			if tc != nil && tc.UnmarshalTo(&h) == nil && h.GetRds().GetRouteConfigName() != "" {
				out = append(out, Ref{TypeURL: resource.RouteType, Name: h.GetRds().GetRouteConfigName()})
			}
		}
		rds(m.GetApiListener().GetApiListener())
		for _, fc := range m.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				rds(f.GetTypedConfig())
			}
			out = appendSecrets(out, fc.GetTransportSocket().GetTypedConfig(), &tlsv3.DownstreamTlsContext{})
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
		return appendSecrets(out, m.GetTransportSocket().GetTypedConfig(), &tlsv3.UpstreamTlsContext{})
	}
	return nil
}

// appendSecrets adds the SDS secrets (certificates, validation context) the TLS context tc names.
func appendSecrets(out []Ref, tc *anypb.Any, tls interface {
	proto.Message
	GetCommonTlsContext() *tlsv3.CommonTlsContext
}) []Ref {
	if tc == nil || tc.UnmarshalTo(tls) != nil {
		return out
	}
	c := tls.GetCommonTlsContext()
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

// Resource is one xDS resource, decoded (an Envoy Listener, Cluster, ...).
type Resource = proto.Message

// Ref names a resource another one references: its type URL and name.
type Ref struct {
	TypeURL string `json:"typeUrl"`
	Name    string `json:"name"`
}

// itemCache makes the engine's entry of each resource content once, for every node's snapshot.
type itemCache struct {
	mu     sync.Mutex               // guards byHash, byRaw, making and bad
	byHash generations[string]      // by type URL + hash
	byRaw  generations[rawKey]      // by the resource a RawResponse gave, at its version
	making map[string]chan struct{} // type URL@version -> closed once a node has made its entries (ofRaws)
	bad    map[string]struct{}      // the bad resources logged (logBad)
}

// rawKey is a resource of a RawResponse: the message itself at the response's version, whose
// content a cache does not change without a new version.
type rawKey struct {
	typeURL, version string
	m                Resource
}

// generations are entries by key; once cur holds maxItems it becomes prev, freeing the unused.
type generations[K comparable] struct{ cur, prev map[K]*engine.Entry }

const maxItems = 1 << 16

func (g *generations[K]) get(k K) *engine.Entry {
	e := g.cur[k]
	if e == nil {
		if e = g.prev[k]; e != nil {
			g.put(k, e)
		}
	}
	return e
}

func (g *generations[K]) put(k K, e *engine.Entry) {
	if g.cur == nil || len(g.cur) >= maxItems {
		g.prev, g.cur = g.cur, map[K]*engine.Entry{}
	}
	g.cur[k] = e
}

// versionOf is the version of an encoded resource: a digest of its encoding.
func versionOf(a *anypb.Any) string {
	sum := sha256.Sum256(a.GetValue())
	return hex.EncodeToString(sum[:12])
}

func newItemCache() *itemCache {
	return &itemCache{making: map[string]chan struct{}{}, bad: map[string]struct{}{}}
}

// of returns the entry of a resource of typeURL encoded as a; m is the resource itself where the
// wrapped cache gave it (a RawResponse), else nil and it is decoded from a by a's type URL.
func (c *itemCache) of(typeURL string, a *anypb.Any, m Resource, owners func(string, Resource) []Ref) (*engine.Entry, error) {
	version := versionOf(a)
	key := typeURL + "/" + version
	c.mu.Lock()
	e := c.byHash.get(key)
	c.mu.Unlock()
	if e != nil {
		return e, nil
	}
	if m == nil {
		var err error
		if m, err = a.UnmarshalNew(); err != nil {
			return nil, fmt.Errorf("decode %s as %q (a cache whose type URLs are not the resources' message names must answer with RawResponses): %w", typeURL, a.GetTypeUrl(), err)
		}
	}
	e, err := entryFor(typeURL, a, version, m, owners, owners)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.byHash.put(key, e)
	c.mu.Unlock()
	return e, nil
}

// makeRaw makes the entry of m, a resource of typeURL a RawResponse gave at version, and keeps it
// for the nodes given the same message at the same version (ofRaws).
func (c *itemCache) makeRaw(typeURL, version string, m Resource, owners func(string, Resource) []Ref) (*engine.Entry, error) {
	b, err := cache.MarshalResource(m)
	if err != nil {
		return nil, errNotEncoded{err}
	}
	e, err := c.of(typeURL, &anypb.Any{TypeUrl: typeURL, Value: b}, m, owners)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.byRaw.put(rawKey{typeURL: typeURL, version: version, m: m}, e)
	c.mu.Unlock()
	return e, nil
}

// ofRaws returns the entries of a RawResponse's resources of typeURL at version, in order: nil
// where a resource cannot be encoded or read, its error in errs then. The first node to read a
// version makes its entries while the others wait for them.
func (c *itemCache) ofRaws(typeURL, version string, raw []types.ResourceWithTTL, owners func(string, Resource) []Ref) (out []*engine.Entry, errs []error) {
	out = make([]*engine.Entry, len(raw))
	batch := typeURL + "@" + version
	for {
		c.mu.Lock()
		missing := false
		for i, x := range raw {
			if out[i] == nil {
				out[i] = c.byRaw.get(rawKey{typeURL: typeURL, version: version, m: x.Resource})
				missing = missing || out[i] == nil
			}
		}
		wait, busy := c.making[batch]
		if !missing || !busy {
			if missing {
				c.making[batch] = make(chan struct{})
			}
			c.mu.Unlock()
			break
		}
		c.mu.Unlock()
		<-wait
	}
	if !slices.Contains(out, nil) {
		return out, nil
	}
	errs = make([]error, len(raw))
	for i, x := range raw {
		if out[i] == nil {
			out[i], errs[i] = c.makeRaw(typeURL, version, x.Resource, owners)
		}
	}
	c.mu.Lock()
	close(c.making[batch])
	delete(c.making, batch)
	c.mu.Unlock()
	return out, errs
}

// errNotEncoded is a resource that cannot be encoded.
type errNotEncoded struct{ error }

// entryFor is the engine's entry of r, encoded as a at version: its Refs (the holds') are what
// refs says, its owner check candidate has the type URL as its kind and owners' as its owners.
func entryFor(typeURL string, a *anypb.Any, version string, r Resource, refs, owners func(string, Resource) []Ref) (*engine.Entry, error) {
	name := cache.GetResourceName(r)
	env := &kdsv1.Resource{Kind: typeURL, Name: name}
	for _, ref := range owners(typeURL, r) {
		env.Owners = append(env.Owners, &kdsv1.ResourceKey{Kind: ref.TypeURL, Name: ref.Name})
	}
	return newEntry(typeURL, name, version, a, refsOf(refs(typeURL, r)), env)
}

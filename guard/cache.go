package guard

// kds-host's own cache behind the guard's options: for a server that sets its resources itself.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"

	"github.com/kds-host/kds-host/engine"
)

// Cache is kds-host's own cache with the guard's NACK handling, retry and owner checks, for a
// server that sets its resources itself (SetResources). It serves go-control-plane's delta and
// state-of-the-world servers; a write costs only the streams that hold what changed.
//
//	c, err := guard.NewCache([]string{resource.ClusterType, resource.EndpointType}, guard.Options{})
//	defer c.Close()
//	srv := server.NewServer(ctx, c, c.Callbacks(myCallbacks))
//	c.SetResources(map[string][]types.Resource{resource.ClusterType: {cluster}})
type Cache struct {
	*serving
	owners func(typeURL string, r Resource) []Ref
	types  []string
	setMu  sync.Mutex                          // one SetResources at a time
	built  map[string]map[string]*engine.Entry // SetResources' last entries, by type and name, reused while unchanged
}

// NewCache returns kds-host's cache for types, in the order a client should get them when they
// are ready together (what others reference first). Each is a type URL, given once. Its errors
// name the option at fault. Of Options, it reads all but NodeIndependent and the per-stream
// bounds (it serves one stream per node id); Owners defaults to none, and the reference holds
// (EnvoyReferences) are on unless NoHolds.
func NewCache(types []string, opts Options) (_ *Cache, err error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	if len(types) == 0 {
		return nil, errors.New("guard: NewCache needs the type URLs it serves")
	}
	for i, t := range types {
		if !strings.HasPrefix(t, typeURLPrefix) || slices.Contains(types[:i], t) {
			return nil, fmt.Errorf("guard: NewCache types[%d] %q: want a type URL (%s...), each given once", i, t, typeURLPrefix)
		}
	}
	if opts.Owners == nil { // a client asks for a cluster's endpoints only once it has the cluster
		opts.Owners = func(string, Resource) []Ref { return nil }
	}
	v, err := newServing(types, &opts, engine.Limits{})
	if err != nil {
		return nil, fmt.Errorf("guard: NewCache: %w", err)
	}
	c := &Cache{serving: v, owners: opts.Owners, types: slices.Clone(types)}
	v.list = c.Clients
	return c, nil
}

// typeURLPrefix starts every type URL an xDS server serves.
const typeURLPrefix = "type.googleapis.com/"

// Fetch implements cache.ConfigFetcher (REST), which the cache does not serve.
func (c *Cache) Fetch(ctx context.Context, req *discovery.DiscoveryRequest) (cache.Response, error) {
	return c.s.Cache.Fetch(ctx, req)
}

// Callbacks returns the server callbacks the cache follows each stream with: pass them to
// server.NewServer. Each stream callback, SotW and delta, calls the cache's and then next's (may
// be nil). Without them, a client's first request is refused with FailedPrecondition, and logged.
func (c *Cache) Callbacks(next server.Callbacks) server.Callbacks { return c.s.Callbacks(next) }

// SetResources replaces what the cache serves: every resource of every type, by type URL. A
// resource's version is a digest of its content, so a client is sent only what changed. A type
// the cache was not made for, or a resource without a name, is refused, and nothing changes.
func (c *Cache) SetResources(resources map[string][]types.Resource) error {
	c.setMu.Lock()
	defer c.setMu.Unlock()
	built := make(map[string]map[string]*engine.Entry, len(resources))
	var entries []*engine.Entry
	for _, typeURL := range slices.Sorted(maps.Keys(resources)) {
		if !slices.Contains(c.types, typeURL) {
			return fmt.Errorf("guard: type %q is not one of the cache's (%v)", typeURL, c.types)
		}
		byName := map[string]*engine.Entry{}
		for _, r := range resources[typeURL] {
			e, err := c.entry(typeURL, r)
			if err != nil {
				return err
			}
			if _, dup := byName[e.Name]; dup {
				return fmt.Errorf("guard: %s %q given twice", shortType(typeURL), e.Name)
			}
			byName[e.Name] = e
			entries = append(entries, e)
		}
		built[typeURL] = byName
	}
	c.built = built
	c.s.SetSnapshot(engine.SnapshotOf(entries))
	return nil
}

// entry encodes one resource, or reuses its last entry when its content (version) is the same.
func (c *Cache) entry(typeURL string, r types.Resource) (*engine.Entry, error) {
	a, version, err := encode(typeURL, r)
	if err != nil {
		return nil, err
	}
	if old := c.built[typeURL][cache.GetResourceName(r)]; old != nil && old.Version == version {
		return old, nil
	}
	return entryFor(typeURL, a, version, r, EnvoyReferences, c.owners)
}

// Clients returns every connected client's insight, by node id (one stream each: a client's
// newer stream replaces its older one).
func (c *Cache) Clients() []ClientInsight {
	out := c.clients(func(node string, stream int64) ClientInsight {
		return ClientInsight{Stream: stream, Delta: true, Node: node}
	})
	slices.SortFunc(out, func(a, b ClientInsight) int { return strings.Compare(a.Node, b.Node) })
	return out
}

package guard

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// Resource is one xDS resource, decoded (an Envoy Listener, Cluster, ...).
type Resource = proto.Message

// Ref names a resource another one references: its type URL and name.
type Ref struct {
	TypeURL string `json:"typeUrl"`
	Name    string `json:"name"`
}

// item is one resource version as the wrapped cache serves it: its name, a version that changes
// exactly when its content does (a hash of its encoding), the encoding itself (shared by every
// response that carries it) and what it references.
type item struct {
	name    string
	version string
	any     *anypb.Any
	refs    []Ref
	wire    *discovery.Resource // as a delta response carries it, shared by every one (nil: made for each)
}

// resource is the item as a delta response carries it.
func (it *item) resource() *discovery.Resource {
	if it.wire != nil {
		return it.wire
	}
	return &discovery.Resource{Name: it.name, Version: it.version, Resource: it.any}
}

// itemCache decodes each resource content once, whatever the streams and responses that carry
// it: by the hash of its encoding. It keeps the contents of the last two generations only, so
// that what no response carries any more is freed.
type itemCache struct {
	mu        sync.Mutex       // guards cur and prev
	cur, prev map[string]*item // by type URL + hash
	limit     int
}

// versionOf is the version of an encoded resource: a digest of its encoding, so that equal
// content has one version whichever cache or node it comes from.
func versionOf(a *anypb.Any) string {
	sum := sha256.Sum256(a.GetValue())
	return hex.EncodeToString(sum[:12])
}

func newItemCache() *itemCache {
	return &itemCache{cur: map[string]*item{}, prev: map[string]*item{}, limit: 1 << 16}
}

// of returns the item of a resource of typeURL encoded as a; m is the resource itself where the
// wrapped cache gave it (a RawResponse), else nil and it is decoded from a by a's type URL.
func (c *itemCache) of(typeURL string, a *anypb.Any, m Resource, owners func(string, Resource) []Ref) (*item, error) {
	version := versionOf(a)
	key := typeURL + "/" + version
	c.mu.Lock()
	it := c.cur[key]
	if it == nil {
		if it = c.prev[key]; it != nil {
			c.cur[key] = it
		}
	}
	c.mu.Unlock()
	if it != nil {
		return it, nil
	}
	if m == nil {
		var err error
		if m, err = a.UnmarshalNew(); err != nil {
			return nil, fmt.Errorf("decode %s as %q (a cache whose type URLs are not the resources' message names must answer with RawResponses): %w", typeURL, a.GetTypeUrl(), err)
		}
	}
	it = &item{name: cache.GetResourceName(m), version: version, any: a, refs: owners(typeURL, m)}
	it.wire = &discovery.Resource{Name: it.name, Version: version, Resource: a}
	c.mu.Lock()
	if len(c.cur) >= c.limit {
		c.prev, c.cur = c.cur, map[string]*item{}
	}
	c.cur[key] = it
	c.mu.Unlock()
	return it, nil
}

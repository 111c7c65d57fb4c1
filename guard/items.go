package guard

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kds-host/kds-host/engine"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// Resource is one xDS resource, decoded (an Envoy Listener, Cluster, ...).
type Resource = proto.Message

// Ref names a resource another one references: its type URL and name.
type Ref struct {
	TypeURL string `json:"typeUrl"`
	Name    string `json:"name"`
}

// itemCache makes the engine's entry of each resource content once, whatever the nodes and
// responses that carry it: by the hash of its encoding, so one version's entry (and its one
// encoding) is shared by every node's snapshot. It keeps the entries of the last two
// generations only, so that what no snapshot holds any more is freed.
type itemCache struct {
	mu        sync.Mutex               // guards cur, prev and bad
	cur, prev map[string]*engine.Entry // by type URL + hash
	limit     int
	bad       map[string]struct{} // the bad resources logged (logBad)
}

// versionOf is the version of an encoded resource: a digest of its encoding, so that equal
// content has one version whichever cache or node it comes from.
func versionOf(a *anypb.Any) string {
	sum := sha256.Sum256(a.GetValue())
	return hex.EncodeToString(sum[:12])
}

func newItemCache() *itemCache {
	return &itemCache{cur: map[string]*engine.Entry{}, prev: map[string]*engine.Entry{}, limit: 1 << 16, bad: map[string]struct{}{}}
}

// of returns the entry of a resource of typeURL encoded as a; m is the resource itself where the
// wrapped cache gave it (a RawResponse), else nil and it is decoded from a by a's type URL.
func (c *itemCache) of(typeURL string, a *anypb.Any, m Resource, owners func(string, Resource) []Ref) (*engine.Entry, error) {
	version := versionOf(a)
	key := typeURL + "/" + version
	c.mu.Lock()
	e := c.cur[key]
	if e == nil {
		if e = c.prev[key]; e != nil {
			c.cur[key] = e
		}
	}
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
	if len(c.cur) >= c.limit {
		c.prev, c.cur = c.cur, map[string]*engine.Entry{}
	}
	c.cur[key] = e
	c.mu.Unlock()
	return e, nil
}

// entryFor is the engine's entry of r, encoded as a at version, encoded once for every client
// (the codec): its Refs, for the holds, are what refs says it references; the candidate the owner
// checks read (owner.Mapping's default) has the type URL as its kind and what owners says as its
// owners.
func entryFor(typeURL string, a *anypb.Any, version string, r Resource, refs, owners func(string, Resource) []Ref) (*engine.Entry, error) {
	name := cache.GetResourceName(r)
	env := &kdsv1.Resource{Kind: typeURL, Name: name}
	for _, ref := range owners(typeURL, r) {
		env.Owners = append(env.Owners, &kdsv1.ResourceKey{Kind: ref.TypeURL, Name: ref.Name})
	}
	return newEntry(typeURL, name, version, a, refsOf(refs(typeURL, r)), env)
}

package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// memStore is an in-memory store.Store for tests: the contract of store.Store (generations,
// unchanged writes, the Mesh foreign key, cascading deletes, a Write that stores all or
// nothing, an id and meta) without a database. Fail makes every call return that error; refuse
// makes every write of one key fail, in the middle of a Write.
type memStore struct {
	mu      sync.Mutex
	m       map[resource.Key]resource.Resource
	rev     int64
	changes chan struct{}
	fail    error
	refused map[resource.Key]error
	id      string
	meta    map[string]string
}

var _ store.Store = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{m: map[resource.Key]resource.Resource{}, changes: make(chan struct{}, 1), id: rand.Text(), meta: map[string]string{}}
}

func (s *memStore) Get(_ context.Context, key resource.Key) (resource.Resource, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return resource.Resource{}, s.fail
	}
	r, ok := s.m[key]
	if !ok {
		return resource.Resource{}, store.ErrNotFound
	}
	return r, nil
}

func (s *memStore) List(_ context.Context, kind, mesh string) ([]resource.Resource, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	var out []resource.Resource
	for k, r := range s.m {
		if (kind == "" || k.Kind == kind) && (mesh == "" || k.Mesh == mesh) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Key(), out[j].Key()
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Mesh != b.Mesh {
			return a.Mesh < b.Mesh
		}
		return a.Name < b.Name
	})
	return out, nil
}

func (s *memStore) Put(ctx context.Context, r resource.Resource) (resource.Resource, bool, error) {
	stored, result, err := s.Write(ctx, r, nil)
	return stored, result != store.Unchanged, err
}

// WriteBatch writes each item as Write would; a test double, not one transaction.
func (s *memStore) WriteBatch(ctx context.Context, items []store.WriteItem) ([]store.WriteOutcome, error) {
	out := make([]store.WriteOutcome, len(items))
	for i, it := range items {
		stored, result, err := s.Write(ctx, it.Resource, it.OnCreate)
		out[i] = store.WriteOutcome{Stored: stored, Result: result, Err: err}
	}
	return out, nil
}

func (s *memStore) Write(_ context.Context, r resource.Resource, onCreate []resource.Resource) (resource.Resource, store.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return resource.Resource{}, store.Unchanged, s.fail
	}
	// The transaction: next replaces s.m when every write in it succeeded.
	next := maps.Clone(s.m)
	stored, result, err := s.putIn(next, r)
	if err != nil {
		return resource.Resource{}, store.Unchanged, err
	}
	if result == store.Created {
		for _, c := range onCreate {
			if _, ok := next[c.Key()]; ok {
				continue
			}
			c.Generation = 0
			if _, _, err := s.putIn(next, c); err != nil {
				return resource.Resource{}, store.Unchanged, fmt.Errorf("put %s: %s, created with it: %w", r.Key(), c.Key(), err)
			}
		}
	}
	if result != store.Unchanged {
		s.m = next
		s.wrote()
	}
	return stored, result, nil
}

// putIn is Put into m.
func (s *memStore) putIn(m map[resource.Key]resource.Resource, r resource.Resource) (resource.Resource, store.Result, error) {
	key := r.Key()
	if err := s.refused[key]; err != nil {
		return resource.Resource{}, store.Unchanged, err
	}
	old, found := m[key]
	switch {
	case !found && r.Generation != 0:
		return resource.Resource{}, store.Unchanged, fmt.Errorf("%w: generation %d given, none stored", store.ErrConflict, r.Generation)
	case found && r.Generation != 0 && r.Generation != old.Generation:
		return resource.Resource{}, store.Unchanged, fmt.Errorf("%w: generation %d given, %d stored", store.ErrConflict, r.Generation, old.Generation)
	case found && sameContent(old, r):
		return old, store.Unchanged, nil
	}
	if r.Mesh != "" {
		if _, ok := m[resource.Key{Kind: resource.MeshKind, Name: r.Mesh}]; !ok {
			return resource.Resource{}, store.Unchanged, &store.MissingOwnerError{Key: key, Owner: resource.Key{Kind: resource.MeshKind, Name: r.Mesh}}
		}
	}
	r.Generation = old.Generation + 1
	m[key] = r
	if found {
		return r, store.Updated, nil
	}
	return r, store.Created, nil
}

func (s *memStore) Delete(_ context.Context, key resource.Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	if _, ok := s.m[key]; !ok {
		return store.ErrNotFound
	}
	delete(s.m, key)
	if key.Kind == resource.MeshKind {
		maps.DeleteFunc(s.m, func(k resource.Key, _ resource.Resource) bool { return k.Mesh == key.Name })
	}
	s.wrote()
	return nil
}

func (s *memStore) Apply(context.Context, []resource.Resource, []resource.Key) (map[resource.Key]error, error) {
	return nil, errors.New("memStore: Apply is not used by the API")
}

func (s *memStore) Revision(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev, nil
}

// ChangesSince keeps no history: callers list everything.
func (s *memStore) ChangesSince(context.Context, int64) ([]resource.Resource, []resource.Key, int64, error) {
	return nil, nil, 0, store.ErrResync
}

func (s *memStore) Changes() <-chan struct{} { return s.changes }

func (s *memStore) ID(context.Context) (string, error) { return s.id, nil }

func (s *memStore) Meta(_ context.Context, key string) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == store.IDMetaKey {
		return s.id, true, nil
	}
	v, ok := s.meta[key]
	return v, ok, nil
}

func (s *memStore) SetMeta(_ context.Context, key, value string) error {
	if key == store.IDMetaKey {
		return fmt.Errorf("set meta %q: %w", key, store.ErrReservedMetaKey)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.meta[key] = value
	return nil
}

func (s *memStore) Close() error { return nil }

func (s *memStore) wrote() {
	s.rev++
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

func (s *memStore) setFail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// refuse makes every write of key fail with err.
func (s *memStore) refuse(key resource.Key, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused == nil {
		s.refused = map[resource.Key]error{}
	}
	s.refused[key] = err
}

func sameContent(a, b resource.Resource) bool {
	return maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Owners, b.Owners) && bytes.Equal(a.Spec, b.Spec)
}

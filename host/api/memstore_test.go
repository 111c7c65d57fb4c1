package api_test

import (
	"bytes"
	"context"
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
// unchanged writes, the Mesh foreign key, cascading deletes) without a database. Fail makes
// every call return that error.
type memStore struct {
	mu      sync.Mutex
	m       map[resource.Key]resource.Resource
	rev     int64
	changes chan struct{}
	fail    error
}

var _ store.Store = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{m: map[resource.Key]resource.Resource{}, changes: make(chan struct{}, 1)}
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

func (s *memStore) Put(_ context.Context, r resource.Resource) (resource.Resource, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return resource.Resource{}, false, s.fail
	}
	key := r.Key()
	old, found := s.m[key]
	switch {
	case !found && r.Generation != 0:
		return resource.Resource{}, false, fmt.Errorf("%w: generation %d given, none stored", store.ErrConflict, r.Generation)
	case found && r.Generation != 0 && r.Generation != old.Generation:
		return resource.Resource{}, false, fmt.Errorf("%w: generation %d given, %d stored", store.ErrConflict, r.Generation, old.Generation)
	case found && sameContent(old, r):
		return old, false, nil
	}
	if r.Mesh != "" {
		if _, ok := s.m[resource.Key{Kind: resource.MeshKind, Name: r.Mesh}]; !ok {
			return resource.Resource{}, false, &store.MissingOwnerError{Key: key, Owner: resource.Key{Kind: resource.MeshKind, Name: r.Mesh}}
		}
	}
	r.Generation = old.Generation + 1
	s.m[key] = r
	s.wrote()
	return r, true, nil
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

func sameContent(a, b resource.Resource) bool {
	return maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Owners, b.Owners) && bytes.Equal(a.Spec, b.Spec)
}

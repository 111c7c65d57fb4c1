// Package kds serves resources from the global control plane to zone control planes over delta
// xDS (go-control-plane's delta server) and tracks what each zone ACKed and NACKed. It knows
// nothing of stores or plugins: a Snapshot goes in, responses and stream events come out.
package kds

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// Entry is one resource as the wire carries it.
type Entry struct {
	Key      resource.Key
	Version  string
	Resource *kdsv1.Resource
	Any      *anypb.Any
}

// Snapshot is an immutable view of every resource to serve, by kind and xDS name.
type Snapshot struct {
	kinds map[string]map[string]*Entry
	size  int
}

// Len is the number of resources in the snapshot.
func (s *Snapshot) Len() int {
	if s == nil {
		return 0
	}
	return s.size
}

// Kind returns the entries of one kind by xDS name. The map must not be modified.
func (s *Snapshot) Kind(kind string) map[string]*Entry {
	if s == nil {
		return nil
	}
	return s.kinds[kind]
}

// Get returns one entry.
func (s *Snapshot) Get(k resource.Key) (*Entry, bool) {
	e, ok := s.Kind(k.Kind)[k.XDSName()]
	return e, ok
}

// SnapshotBuilder turns store contents into Snapshots, reusing the encoded entry of a resource
// whose content did not change since the previous build.
type SnapshotBuilder struct {
	prev map[resource.Key]builtEntry
}

type builtEntry struct {
	gen   int64
	spec  string
	entry *Entry
}

// Build returns a snapshot of rs. It is not safe for concurrent use.
func (b *SnapshotBuilder) Build(rs []resource.Resource) (*Snapshot, error) {
	next := make(map[resource.Key]builtEntry, len(rs))
	s := &Snapshot{kinds: map[string]map[string]*Entry{}}
	for i := range rs {
		r := &rs[i]
		key := r.Key()
		be, ok := b.prev[key]
		if !ok || be.gen != r.Generation || be.spec != string(r.Spec) {
			e, err := NewEntry(r)
			if err != nil {
				return nil, err
			}
			be = builtEntry{gen: r.Generation, spec: string(r.Spec), entry: e}
		}
		next[key] = be
		byName := s.kinds[key.Kind]
		if byName == nil {
			byName = map[string]*Entry{}
			s.kinds[key.Kind] = byName
		}
		byName[key.XDSName()] = be.entry
		s.size++
	}
	b.prev = next
	return s, nil
}

// NewEntry encodes one resource for the wire.
func NewEntry(r *resource.Resource) (*Entry, error) {
	p, err := r.ToProto()
	if err != nil {
		return nil, err
	}
	a, err := anypb.New(p)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", r.Key(), err)
	}
	return &Entry{Key: r.Key(), Version: resource.Version(p), Resource: p, Any: a}, nil
}

// Decode reads a resource out of an Any from a KDS response. The Any's type URL is the request's
// type URL (the kind), not the message's, so it is decoded as the one envelope type it always is.
func Decode(a *anypb.Any) (*kdsv1.Resource, error) {
	r := &kdsv1.Resource{}
	if err := proto.Unmarshal(a.GetValue(), r); err != nil {
		return nil, fmt.Errorf("decode kds.v1.Resource: %w", err)
	}
	return r, nil
}

// Kinds returns the kinds the snapshot has resources of, sorted.
func (s *Snapshot) Kinds() []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.kinds))
	for k := range s.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

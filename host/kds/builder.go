package kds

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// SnapshotBuilder turns store contents into Snapshots, reusing the encoded entry of a resource
// whose content did not change since the previous build. Build starts from a full list; Update
// applies changes to the last snapshot built. It is not safe for concurrent use.
//
// A resource that cannot be encoded, or that its caller could not read (unreadable), does not
// stop the others: it is left out, or keeps the version served before, and is listed by
// Unservable until a later version of it encodes or it is deleted.
type SnapshotBuilder struct {
	prev map[resource.Key]builtEntry // what the last snapshot holds
	last *engine.Snapshot
	bad  map[resource.Key]Unservable
}

// Unservable is a stored resource the global cannot read or encode for zones.
type Unservable struct {
	Key        resource.Key `json:"key"`
	Generation int64        `json:"generation"`
	Column     string       `json:"column,omitempty"` // the stored column that cannot be read; empty: it cannot be encoded
	Error      string       `json:"error"`
}

// Unservable lists the resources the last snapshot could not encode, sorted by key.
func (b *SnapshotBuilder) Unservable() []Unservable {
	out := slices.AppendSeq(make([]Unservable, 0, len(b.bad)), maps.Values(b.bad))
	slices.SortFunc(out, func(a, b Unservable) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return out
}

// unreadable records u.
func (b *SnapshotBuilder) unreadable(u Unservable) {
	if b.bad == nil {
		b.bad = map[resource.Key]Unservable{}
	}
	b.bad[u.Key] = u
}

type builtEntry struct {
	gen   int64
	spec  string
	entry *engine.Entry
}

// Build returns a snapshot of rs, the stored resources but the unreadable ones. It fails on
// nothing: a resource that cannot be encoded, and one unreadable, is listed by Unservable.
func (b *SnapshotBuilder) Build(rs []resource.Resource, unreadable ...Unservable) (*engine.Snapshot, error) {
	next := make(map[resource.Key]builtEntry, len(rs))
	entries := make([]*engine.Entry, 0, len(rs))
	b.bad = nil
	keep := func(key resource.Key, be builtEntry) {
		next[key] = be
		entries = append(entries, be.entry)
	}
	for i := range rs {
		r := &rs[i]
		key := r.Key()
		be, ok := b.prev[key]
		if !ok || be.gen != r.Generation || be.spec != string(r.Spec) {
			e, err := NewEntry(r)
			if err != nil {
				b.unreadable(Unservable{Key: key, Generation: r.Generation, Error: err.Error()})
				if !ok {
					continue // never served: left out
				}
			} else {
				be = builtEntry{gen: r.Generation, spec: string(r.Spec), entry: e}
			}
		}
		keep(key, be)
	}
	for _, u := range unreadable {
		if _, listed := next[u.Key]; listed {
			continue
		}
		b.unreadable(u)
		if be, ok := b.prev[u.Key]; ok {
			keep(u.Key, be) // served before: stays
		}
	}
	b.prev, b.last = next, engine.SnapshotOf(entries)
	return b.last, nil
}

// Update returns the last snapshot built with changed put in and deleted taken out; its cost
// follows the size of the change. A change that changes nothing returns the last snapshot
// itself. A resource that cannot be encoded, and one of unreadable, is not applied (its earlier
// version, if any, stays) and is listed by Unservable; the rest is.
func (b *SnapshotBuilder) Update(changed []resource.Resource, deleted []resource.Key, unreadable ...Unservable) (*engine.Snapshot, error) {
	if b.last == nil {
		b.last = engine.SnapshotOf(nil)
	}
	var entries []*engine.Entry
	puts := map[resource.Key]builtEntry{}
	for i := range changed {
		r := &changed[i]
		key := r.Key()
		if be, ok := b.prev[key]; ok && be.gen == r.Generation && be.spec == string(r.Spec) {
			delete(b.bad, key) // served as it is: read again, as its caller found it
			continue
		}
		e, err := NewEntry(r)
		if err != nil {
			b.unreadable(Unservable{Key: key, Generation: r.Generation, Error: err.Error()}) // the version served before, if any, stays
			continue
		}
		delete(b.bad, key)
		puts[key] = builtEntry{gen: r.Generation, spec: string(r.Spec), entry: e}
		entries = append(entries, e)
	}
	var dels []resource.Key
	removed := map[string][]string{}
	for _, k := range deleted {
		delete(b.bad, k)
		if _, ok := b.prev[k]; ok {
			dels = append(dels, k)
			removed[k.Kind] = append(removed[k.Kind], k.XDSName())
		}
	}
	for _, u := range unreadable {
		b.unreadable(u) // the version served before, if any, stays
	}
	if len(entries) == 0 && len(dels) == 0 {
		return b.last, nil
	}
	if b.prev == nil {
		b.prev = map[resource.Key]builtEntry{}
	}
	maps.Copy(b.prev, puts)
	for _, k := range dels {
		delete(b.prev, k)
	}
	b.last = b.last.Update(entries, removed)
	return b.last, nil
}

// NewEntry encodes one resource for the wire.
func NewEntry(r *resource.Resource) (*engine.Entry, error) {
	p, err := r.ToProto()
	if err != nil {
		return nil, err
	}
	a, err := anypb.New(p)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", r.Key(), err)
	}
	name, version := r.Key().XDSName(), resource.Version(p)
	e := &engine.Entry{TypeURL: r.Kind, Name: name, Version: version, Any: a, Source: &Source{Key: r.Key(), Resource: p},
		Wire: &discovery.Resource{Name: name, Version: version, Resource: a}}
	if err := e.EncodeWire(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", r.Key(), err)
	}
	return e, nil
}

// Decode reads a resource out of an Any from a KDS response (whose type URL is the kind's).
func Decode(a *anypb.Any) (*kdsv1.Resource, error) {
	r := &kdsv1.Resource{}
	if err := proto.Unmarshal(a.GetValue(), r); err != nil {
		return nil, fmt.Errorf("decode kds.v1.Resource: %w", err)
	}
	return r, nil
}

// Source is what kds-host's entries carry (Entry.Source): the resource's key and its kds.v1
// envelope.
type Source struct {
	Key      resource.Key
	Resource *kdsv1.Resource
}

// KeyOf is the key of an entry kds-host built (NewEntry, or one with a Source).
func KeyOf(e *engine.Entry) resource.Key { return e.Source.(*Source).Key }

// ResourceOf is the kds.v1 resource of an entry kds-host built.
func ResourceOf(e *engine.Entry) *kdsv1.Resource { return e.Source.(*Source).Resource }

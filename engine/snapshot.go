package engine

import (
	"maps"
	"slices"
	"sort"
	"sync"
	"weak"

	"google.golang.org/grpc/mem"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Entry is one resource version as the wire carries it: immutable once a snapshot holds it.
type Entry struct {
	TypeURL string // its type: the entry's key in Snapshot.Type (kds-host: the kind's name)
	Name    string // its name within the type
	Version string
	Any     *anypb.Any
	// Wire is the entry as a delta response carries it, shared by every response that sends
	// this version: read-only.
	Wire *discovery.Resource
	// Size is Wire's encoded size in a response (0: measured when needed).
	Size int
	// Source is the builder's own value of the resource (kds-host: its Source), read-only.
	Source any
	// Refs is what the resource references, for a Withholder (Cache.SetWithholder).
	Refs []Ref
	// frame is Wire encoded as one of a delta response's resources (nil: encoded per response),
	// written by every stream's response (codec.go).
	frame mem.Buffer
}

// Ref names a resource: its type and its name within the type.
type Ref struct{ TypeURL, Name string }

// WireOverhead is what one resource or removed name adds to a response beyond its own bytes
// (its field tag and length), at most.
const WireOverhead = 16

// wireSize is the bytes e adds to a delta response.
func (e *Entry) wireSize() int {
	if e.Size > 0 {
		return e.Size
	}
	return proto.Size(e.Wire) + WireOverhead
}

// Snapshot is an immutable view of every resource to serve, by type URL and xDS name.
type Snapshot struct {
	kinds map[string]map[string]*Entry
	size  int
	// declared: a type without entries stays in kinds (Declare), and Has reports it.
	declared bool

	// A snapshot made by Update knows the one it was derived from (weakly: it does not keep it
	// alive) and the xDS names, by type URL, whose entries differ from it (added,
	// changed or removed; each name once), so a Cache serving base looks at those names only.
	base    weak.Pointer[Snapshot]
	changed map[string][]string

	deps deps // what references each Ref (deps.go)

	kindsMu sync.Mutex            // guards wires and orders
	wires   map[string]*kindWire  // type URL -> its entries' encoding end to end; made on first use (codec.go)
	orders  map[string]*kindOrder // type URL -> its names and entries in name order; made on first use
}

// kindOrder is a type's names and entries in name order, and what a node that ACKed exactly them
// adds to its digest, made once per snapshot and type: every stream's full sync of the type walks
// it, and the ACK of a response that carried all of it is one XOR (Session.answerLocked).
type kindOrder struct {
	once    sync.Once
	names   []string
	entries []*Entry
	acked   uint64 // XOR of ackedHash of every entry, as sent
	// wires is each entry's Wire, in name order: the resources of a response that sends a node
	// all of the type (its full sync), shared by every such response and never modified; size
	// is their wireSize summed.
	wires []*discovery.Resource
	anys  []*anypb.Any // each entry's Any, in name order: a SotW response of all of the type
	size  int
	// anysRun is anys encoded end to end as a SotW response's resources, made the first time
	// the codec writes such a response (nil: it could not be).
	anysOnce sync.Once
	anysRun  []byte
}

// perKind is m's value for a type URL, a zero one added if there is none, under s.kindsMu: what
// a snapshot derives per type on first use (its once then makes it).
func perKind[T any](s *Snapshot, m *map[string]*T, kind string) *T {
	s.kindsMu.Lock()
	defer s.kindsMu.Unlock()
	v := (*m)[kind]
	if v == nil {
		v = new(T)
		if *m == nil {
			*m = map[string]*T{}
		}
		(*m)[kind] = v
	}
	return v
}

// order is the type's kindOrder, made on first use.
func (s *Snapshot) order(kind string) *kindOrder {
	ko := perKind(s, &s.orders, kind)
	ko.once.Do(func() {
		byName := s.Type(kind)
		ko.names = slices.Sorted(maps.Keys(byName))
		ko.entries = make([]*Entry, len(ko.names))
		ko.wires = make([]*discovery.Resource, len(ko.names))
		ko.anys = make([]*anypb.Any, len(ko.names))
		for i, n := range ko.names {
			e := byName[n]
			ko.entries[i], ko.wires[i], ko.anys[i] = e, e.Wire, e.Any
			ko.acked ^= ackedHash(kind, e.Wire.GetName(), e.Wire.GetVersion())
			ko.size += e.wireSize()
		}
	})
	return ko
}

// isAll reports whether rs is ko.wires itself (not a copy): a response made as all of the type.
func (ko *kindOrder) isAll(rs []*discovery.Resource) bool {
	return len(rs) > 0 && len(rs) == len(ko.wires) && &rs[0] == &ko.wires[0]
}

// Names returns the xDS names of one type, sorted. The slice must not be modified.
func (s *Snapshot) Names(typeURL string) []string {
	if s == nil {
		return nil
	}
	return s.order(typeURL).names
}

// ChangesFrom returns, when s was derived from prev by Update, the names by type URL in which the
// two differ, each once; ok is false when s is not known to be derived from prev.
func (s *Snapshot) ChangesFrom(prev *Snapshot) (changed map[string][]string, ok bool) {
	if s == nil || prev == nil || s.changed == nil || s.base != weak.Make(prev) {
		return nil, false
	}
	return s.changed, true
}

// Len is the number of resources in the snapshot.
func (s *Snapshot) Len() int {
	if s == nil {
		return 0
	}
	return s.size
}

// Type returns the entries of one type by xDS name. The map must not be modified.
func (s *Snapshot) Type(typeURL string) map[string]*Entry {
	if s == nil {
		return nil
	}
	return s.kinds[typeURL]
}

// Update returns s with put in (each replacing the entry of its type and name, if any) and
// removed (type URL -> names) taken out, derived from s: ChangesFrom(s) names, by type, each name
// that differs, once. Only the types it touches get new maps; the others are shared with s, so
// its cost follows the size of the change, not of the snapshot. A name both put and removed is
// removed.
func (s *Snapshot) Update(put []*Entry, removed map[string][]string) *Snapshot {
	if s == nil {
		s = &Snapshot{kinds: map[string]map[string]*Entry{}}
	}
	d := &Snapshot{kinds: maps.Clone(s.kinds), size: s.size, base: weak.Make(s), changed: map[string][]string{}, declared: s.declared}
	defer func() { d.deps.derive(&s.deps, d.changed) }()
	own := func(typeURL string) map[string]*Entry { // copy on first write
		if _, ok := d.changed[typeURL]; !ok {
			m := maps.Clone(s.kinds[typeURL])
			if m == nil {
				m = map[string]*Entry{}
			}
			d.kinds[typeURL] = m
			d.changed[typeURL] = nil
		}
		return d.kinds[typeURL]
	}
	type ref struct{ typeURL, name string }
	seen := make(map[ref]bool, len(put)) // a name put twice, or put and removed
	changedName := func(typeURL, name string) {
		if !seen[ref{typeURL, name}] {
			seen[ref{typeURL, name}] = true
			d.changed[typeURL] = append(d.changed[typeURL], name)
		}
	}
	for _, e := range put {
		byName := own(e.TypeURL)
		if _, ok := byName[e.Name]; !ok {
			d.size++
		}
		byName[e.Name] = e
		changedName(e.TypeURL, e.Name)
	}
	for typeURL, names := range removed {
		for _, name := range names {
			byName := own(typeURL)
			if _, ok := byName[name]; !ok {
				continue // not there, or named twice: gone already
			}
			delete(byName, name)
			d.size--
			changedName(typeURL, name)
		}
	}
	for typeURL, names := range d.changed {
		if len(names) == 0 {
			delete(d.changed, typeURL) // touched, nothing changed
		}
		if len(d.kinds[typeURL]) == 0 && !d.declared {
			delete(d.kinds, typeURL) // as SnapshotOf: a snapshot has no empty type
		}
	}
	return d
}

// Declare returns s with typeURLs in it even when they have no entries (Has reports them),
// derived from s as Update's are: the snapshot of a cache that tells a type with no resources
// from a type it has not answered yet. A type emptied by Update stays in a snapshot derived from
// a declared one. A Cache does not answer a watch of a type a declared snapshot lacks (the watch
// stays open) until the snapshot has it.
func (s *Snapshot) Declare(typeURLs ...string) *Snapshot {
	d := s.Update(nil, nil)
	d.declared = true
	for _, t := range typeURLs {
		if _, ok := d.kinds[t]; !ok {
			d.kinds[t] = map[string]*Entry{}
		}
	}
	return d
}

// Has reports whether s has typeURL: entries of it, or it declared (Declare).
func (s *Snapshot) Has(typeURL string) bool {
	if s == nil {
		return false
	}
	_, ok := s.kinds[typeURL]
	return ok
}

// SnapshotOf is a snapshot of entries, by type and name. An entry whose type and name were given
// before replaces it.
func SnapshotOf(entries []*Entry) *Snapshot {
	s := &Snapshot{kinds: map[string]map[string]*Entry{}}
	for _, e := range entries {
		byName := s.kinds[e.TypeURL]
		if byName == nil {
			byName = map[string]*Entry{}
			s.kinds[e.TypeURL] = byName
		}
		if _, ok := byName[e.Name]; !ok {
			s.size++
		}
		byName[e.Name] = e
	}
	return s
}

// EncodeWire encodes e's Wire once, as the Cache's codec writes it in every response that
// carries this version (without it, it is encoded for each), and sets Size to match. Whoever
// builds an Entry calls it once its Wire is set, before a snapshot holds it (kds-host's NewEntry
// does).
func (e *Entry) EncodeWire() error {
	f, err := encodeFrame(e.Wire)
	if err != nil {
		return err
	}
	e.frame = mem.SliceBuffer(f)
	e.Size = proto.Size(e.Wire) + WireOverhead
	return nil
}

// Types returns the type URLs the snapshot has resources of, sorted.
func (s *Snapshot) Types() []string {
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

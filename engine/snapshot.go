// Package engine serves xDS resources to clients and keeps, for each client stream, what the
// client holds: what it was sent, what it acknowledged and refused, the responses in flight, and
// what must be sent again. A Snapshot goes in; responses and stream events come out. It serves
// go-control-plane's delta server (Cache is its cache.Cache, Tracker its callbacks) or its own
// delta ADS loop (DeltaADS), and knows nothing of stores or plugins.
package engine

import (
	"maps"
	"slices"
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
	Wire    *discovery.Resource // as a delta response carries it; shared, read-only
	Size    int                 // Wire's encoded size in a response (0: measured when needed)
	Source  any                 // the builder's own value of the resource (kds-host: its Source), read-only
	Refs    []Ref               // what the resource references, for a Withholder (Cache.SetWithholder)
	frame   mem.Buffer          // Wire encoded as a response's resource (nil: encoded per response; codec.go)
}

// Ref names a resource: its type and its name within the type.
type Ref struct{ TypeURL, Name string }

// WireOverhead is the most one resource or removed name adds to a response beyond its own bytes.
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
	kinds    map[string]map[string]*Entry
	size     int
	declared bool // a type without entries stays in kinds (Declare)

	// Set by Update: the snapshot derived from (weakly held), and the names by type URL that differ from it.
	base    weak.Pointer[Snapshot]
	changed map[string][]string

	deps deps // what references each Ref (deps.go)

	kindsMu sync.Mutex            // guards orders
	orders  map[string]*kindOrder // type URL -> its entries in name order and their encodings; made on first use
}

// kindOrder is a type's entries in name order, made once per snapshot and type; read-only once made.
type kindOrder struct {
	once     sync.Once
	names    []string
	entries  []*Entry
	acked    uint64                // XOR of ackedHash of every entry (Session.answerLocked)
	wires    []*discovery.Resource // each entry's Wire: a delta full sync's resources
	anys     []*anypb.Any          // each entry's Any: a SotW response of all of the type
	size     int                   // wires' wireSize, summed
	anysOnce sync.Once
	anysRun  []byte // anys encoded end to end (nil: could not be); made by the codec
	runOnce  sync.Once
	index    map[string]int // name -> its place in entries (nil: an entry not encoded, so no run)
	run      []byte         // the entries' frames end to end (codec.go)
	off      []int          // where each entry's frame starts in run, and len(run) last
}

func (s *Snapshot) order(kind string) *kindOrder {
	s.kindsMu.Lock()
	ko := s.orders[kind]
	if ko == nil {
		ko = new(kindOrder)
		if s.orders == nil {
			s.orders = map[string]*kindOrder{}
		}
		s.orders[kind] = ko
	}
	s.kindsMu.Unlock()
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

// Update returns a snapshot derived from s with put in and removed (type URL -> names) taken out
// (a name in both is removed); its ChangesFrom(s) names each name that differs, once. It costs
// the size of the change: untouched types share s's maps.
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
	seen := make(map[Ref]bool, len(put)) // a name put twice, or put and removed
	changedName := func(typeURL, name string) {
		if !seen[Ref{typeURL, name}] {
			seen[Ref{typeURL, name}] = true
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
				continue // not there, or named twice
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
			delete(d.kinds, typeURL) // as SnapshotOf: no empty type
		}
	}
	return d
}

// Declare returns s, derived as by Update, with typeURLs in it even when they have no entries
// (Has reports them); a type emptied by a later Update stays. A Cache does not answer a watch of
// a type a declared snapshot lacks until the snapshot has it.
func (s *Snapshot) Declare(typeURLs ...string) *Snapshot {
	d := s.Update(nil, nil)
	d.declared = true
	for _, t := range typeURLs {
		if _, ok := d.kinds[t]; !ok {
			d.kinds[t] = map[string]*Entry{}
			d.changed = nil // a type added: every watch is looked at (ChangesFrom has no answer)
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

// SnapshotOf is a snapshot of entries; a later entry of the same type and name replaces an earlier one.
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

// EncodeWire encodes e's Wire once for every response that carries it, and sets Size. Call it
// once Wire is set, before a snapshot holds e (kds-host's NewEntry does); without it, e is
// encoded per response.
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
	out := slices.AppendSeq(make([]string, 0, len(s.kinds)), maps.Keys(s.kinds))
	slices.Sort(out)
	return out
}

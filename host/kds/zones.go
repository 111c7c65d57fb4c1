package kds

import (
	"hash/maphash"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/shrink"
)

// Zones is the Observer that keeps, per zone, what it holds (its inventory: what it ACKed) and
// the insight counters per kind that the API and `kds-host inspect zones` show.
type Zones struct {
	mu    sync.Mutex
	zones map[string]*zoneState
	peak  shrink.Peak
}

type zoneState struct {
	stream    int64
	connected bool
	since     time.Time
	kinds     map[string]*KindInsight
	inventory map[string]map[string]string // kind -> xDS name -> version
	digest    Digest                       // of inventory
}

// Digest identifies what a zone holds (every kind, name and version) without listing it: two
// zones with equal digests hold the same, but for a 2^-64 chance. It is kept as each ACK lands
// (the XOR of one hash per resource held), so reading it costs nothing.
type Digest struct {
	Sum uint64
	N   int // resources held
}

// digestSeed is this process's: digests are compared within one process only.
var digestSeed = maphash.MakeSeed()

func heldHash(kind, name, version string) uint64 {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	h.WriteString(kind)
	h.WriteByte(0)
	h.WriteString(name)
	h.WriteByte(0)
	h.WriteString(version)
	return h.Sum64()
}

// hold records that the zone holds kind/name at version (nothing: "" and !ok) in its inventory and
// its digest.
func (s *zoneState) hold(inv map[string]string, kind, name, version string, ok bool) {
	if old, had := inv[name]; had {
		s.digest.Sum ^= heldHash(kind, name, old)
		s.digest.N--
	}
	if !ok {
		delete(inv, name)
		return
	}
	inv[name] = version
	s.digest.Sum ^= heldHash(kind, name, version)
	s.digest.N++
}

// KindInsight is what happened to one kind on one zone.
type KindInsight struct {
	Kind      string            `json:"kind"`
	Sent      int64             `json:"sent"`
	Responses int64             `json:"responses"`
	ACKs      int64             `json:"acks"`
	NACKs     int64             `json:"nacks"`
	LastError string            `json:"lastError,omitempty"`
	Rejected  []event.Rejection `json:"rejected,omitempty"`
	Held      int               `json:"held,omitempty"`
	Known     int               `json:"known"`
}

// ZoneInsight is one zone's state.
type ZoneInsight struct {
	Zone      string         `json:"zone"`
	Connected bool           `json:"connected"`
	Stream    int64          `json:"stream,omitempty"`
	Since     time.Time      `json:"since"`
	Kinds     []*KindInsight `json:"kinds"`
}

// NewZones returns an empty zone table.
func NewZones() *Zones { return &Zones{zones: map[string]*zoneState{}} }

// Observer is how the zone table hears of stream events.
func (z *Zones) Observer() event.Observer {
	return event.Observer{StreamOpened: z.streamOpened, Sent: z.sent, ACK: z.acked, NACK: z.nacked, StreamClosed: z.streamClosed}
}

func (z *Zones) zone(name string) *zoneState {
	s := z.zones[name]
	if s == nil {
		s = &zoneState{kinds: map[string]*KindInsight{}, inventory: map[string]map[string]string{}}
		z.zones[name] = s
	}
	return s
}

func (s *zoneState) kind(k string) *KindInsight {
	ki := s.kinds[k]
	if ki == nil {
		ki = &KindInsight{Kind: k}
		s.kinds[k] = ki
	}
	return ki
}

// inventoryOf is what the zone holds of kind; an empty one is made for at least hint names (the
// first ACK's), so that it does not grow one doubling at a time.
func (s *zoneState) inventoryOf(kind string, hint int) map[string]string {
	inv := s.inventory[kind]
	if len(inv) == 0 && hint > 8 {
		inv = make(map[string]string, hint)
		s.inventory[kind] = inv
	} else if inv == nil {
		inv = map[string]string{}
		s.inventory[kind] = inv
	}
	return inv
}

// streamOpened: a zone's new stream starts from what the zone reports.
func (z *Zones) streamOpened(id int64, zone string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.zone(zone)
	s.stream, s.connected, s.since = id, true, time.Now()
	s.inventory, s.digest = map[string]map[string]string{}, Digest{}
	for _, ki := range s.kinds {
		ki.Rejected, ki.LastError = nil, ""
	}
}

func (z *Zones) sent(e event.Sent) {
	z.mu.Lock()
	defer z.mu.Unlock()
	ki := z.zone(e.Zone).kind(e.Kind)
	ki.Responses++
	ki.Sent += int64(len(e.Versions) + len(e.Removed))
}

// onStream is the zone's state when id is its current stream, else nil. Call with z.mu held.
func (z *Zones) onStream(zone string, id int64) *zoneState {
	if s := z.zones[zone]; s != nil && s.stream == id {
		return s
	}
	return nil
}

func (z *Zones) acked(a event.ACK) {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.onStream(a.Zone, a.StreamID)
	if s == nil {
		return
	}
	ki := s.kind(a.Kind)
	inv := s.inventory[a.Kind]
	if len(inv) == 0 && !a.Initial && len(a.Versions) > 0 {
		// The kind's first ACK on this stream: the response's map becomes the inventory, no copy
		// (event.ACK: the tracker drops it with the ACK).
		inv = a.Versions
		s.inventory[a.Kind] = inv
		for n, v := range inv {
			s.digest.Sum ^= heldHash(a.Kind, n, v)
			s.digest.N++
		}
	} else {
		inv = s.inventoryOf(a.Kind, len(a.Versions))
		for n, v := range a.Versions {
			s.hold(inv, a.Kind, n, v, true)
		}
	}
	for _, n := range a.Removed {
		s.hold(inv, a.Kind, n, "", false)
	}
	ki.Known = len(inv)
	if !a.Initial {
		ki.ACKs++
		ki.Rejected, ki.LastError = nil, ""
	}
}

func (z *Zones) nacked(n event.NACK) {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.onStream(n.Zone, n.StreamID)
	if s == nil {
		return
	}
	ki := s.kind(n.Kind)
	ki.NACKs++
	ki.LastError = n.Detail
	ki.Rejected = n.Rejected
	inv := s.inventoryOf(n.Kind, len(n.Accepted))
	for name, v := range n.Accepted {
		s.hold(inv, n.Kind, name, v, true)
	}
	ki.Known = len(inv)
}

func (z *Zones) streamClosed(id int64, zone string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if s := z.onStream(zone, id); s != nil {
		s.connected = false
		s.since = time.Now()
	}
}

// Expire frees the state of every zone whose last stream closed before the given time, and
// returns their names.
func (z *Zones) Expire(before time.Time) []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []string
	for name, s := range z.zones {
		if !s.connected && s.since.Before(before) {
			delete(z.zones, name)
			out = append(out, name)
		}
	}
	z.zones = shrink.Map(z.zones, &z.peak)
	sort.Strings(out)
	return out
}

// Inventory returns the keys the zone has ACKed.
func (z *Zones) Inventory(zone string) []resource.Key { return z.InventoryKeys(zone, nil, nil) }

// Insights returns every zone's state, sorted by zone and kind.
func (z *Zones) Insights() []ZoneInsight {
	z.mu.Lock()
	defer z.mu.Unlock()
	out := make([]ZoneInsight, 0, len(z.zones))
	for name, s := range z.zones {
		zi := ZoneInsight{Zone: name, Connected: s.connected, Stream: s.stream, Since: s.since}
		for _, ki := range s.kinds {
			c := *ki
			c.Rejected = append([]event.Rejection(nil), ki.Rejected...)
			zi.Kinds = append(zi.Kinds, &c)
		}
		sort.Slice(zi.Kinds, func(i, j int) bool { return zi.Kinds[i].Kind < zi.Kinds[j].Kind })
		out = append(out, zi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Zone < out[j].Zone })
	return out
}

// Known reports whether the zone is in the table: connected, or left within its grace.
func (z *Zones) Known(zone string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	_, ok := z.zones[zone]
	return ok
}

// HeldVersion returns the version of a resource (kind, xDS name) the zone has ACKed.
func (z *Zones) HeldVersion(zone, kind, name string) (string, bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.zones[zone]
	if s == nil {
		return "", false
	}
	v, ok := s.inventory[kind][name]
	return v, ok
}

// InventoryKeys returns the keys the zone has ACKed of the given kinds (nil: of every kind),
// and of the extra keys it holds.
func (z *Zones) InventoryKeys(zone string, kinds []string, extra []resource.Key) []resource.Key {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.zones[zone]
	if s == nil {
		return nil
	}
	var out []resource.Key
	add := func(kind string) {
		for n := range s.inventory[kind] {
			out = append(out, resource.KeyFromXDSName(kind, n))
		}
	}
	if kinds == nil {
		for kind := range s.inventory {
			add(kind)
		}
		return out
	}
	for _, kind := range kinds {
		add(kind)
	}
	for _, k := range extra {
		if slices.Contains(kinds, k.Kind) {
			continue // already there
		}
		if _, ok := s.inventory[k.Kind][k.XDSName()]; ok {
			out = append(out, k)
		}
	}
	return out
}

// InventoryDigest identifies what the zone holds now (the zero Digest for nothing, or an
// unknown zone).
func (z *Zones) InventoryDigest(zone string) Digest {
	z.mu.Lock()
	defer z.mu.Unlock()
	if s := z.zones[zone]; s != nil {
		return s.digest
	}
	return Digest{}
}

// Versions returns what the zone holds: kind -> xDS name -> version. The caller owns the copy.
func (z *Zones) Versions(zone string) map[string]map[string]string {
	z.mu.Lock()
	defer z.mu.Unlock()
	out := map[string]map[string]string{}
	if s := z.zones[zone]; s != nil {
		for kind, names := range s.inventory {
			m := make(map[string]string, len(names))
			for n, v := range names {
				m[n] = v
			}
			out[kind] = m
		}
	}
	return out
}

// Connected returns the names of the zones with an open stream.
func (z *Zones) Connected() []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []string
	for name, s := range z.zones {
		if s.connected {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

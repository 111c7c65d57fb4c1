package kds

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/shrink"
)

// Zones is the Observer that keeps, per zone, the insight counters per kind that the API and
// `kds-host inspect zones` show, and the zone's session (its current stream's, or its last one's
// while the zone is within its grace), which says what the zone holds: Zones keeps no copy.
type Zones struct {
	cache *Cache

	mu    sync.Mutex
	zones map[string]*zoneState
	peak  shrink.Peak
}

type zoneState struct {
	stream    int64
	connected bool
	since     time.Time
	kinds     map[string]*KindInsight
	session   *Session // of stream; nil until it opened
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
	// Withheld counts the resources of the kind the global withholds from the zone (owner
	// holds: WAIT or REJECT), set by the controlplane's zone views.
	Withheld int `json:"withheld,omitempty"`
	Known    int `json:"known"`
	// Held is Withheld under its old JSON name, for the clients that read "held".
	//
	// Deprecated: use Withheld (JSON "withheld"); "held" is emitted for one more release only.
	Held int `json:"held,omitempty"`
}

// ZoneInsight is one zone's state.
type ZoneInsight struct {
	Zone      string         `json:"zone"`
	Connected bool           `json:"connected"`
	Stream    int64          `json:"stream,omitempty"`
	Since     time.Time      `json:"since"`
	Kinds     []*KindInsight `json:"kinds"`
}

// NewZones returns an empty zone table over the sessions of c.
func NewZones(c *Cache) *Zones { return &Zones{cache: c, zones: map[string]*zoneState{}} }

// Observer is how the zone table hears of stream events.
func (z *Zones) Observer() event.Observer {
	return event.Observer{StreamOpened: z.streamOpened, Sent: z.sent, ACK: z.acked, NACK: z.nacked, StreamClosed: z.streamClosed}
}

func (z *Zones) zone(name string) *zoneState {
	s := z.zones[name]
	if s == nil {
		s = &zoneState{kinds: map[string]*KindInsight{}}
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

// streamOpened: a zone's new stream starts from what the zone reports.
func (z *Zones) streamOpened(id int64, zone string) {
	session := z.cache.Session(id)
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.zone(zone)
	s.stream, s.connected, s.since, s.session = id, true, time.Now(), session
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
	if s == nil || a.Initial {
		return
	}
	ki := s.kind(a.Kind)
	ki.ACKs++
	ki.Rejected, ki.LastError = nil, ""
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
}

func (z *Zones) streamClosed(id int64, zone string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if s := z.onStream(zone, id); s != nil {
		s.connected = false
		s.since = time.Now()
	}
}

// session is the zone's session (current, or its last within its grace), or nil.
func (z *Zones) session(zone string) *Session {
	z.mu.Lock()
	defer z.mu.Unlock()
	if s := z.zones[zone]; s != nil {
		return s.session
	}
	return nil
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
	out := make([]ZoneInsight, 0, len(z.zones))
	sessions := make([]*Session, 0, len(z.zones))
	for name, s := range z.zones {
		zi := ZoneInsight{Zone: name, Connected: s.connected, Stream: s.stream, Since: s.since}
		for _, ki := range s.kinds {
			c := *ki
			c.Rejected = append([]event.Rejection(nil), ki.Rejected...)
			zi.Kinds = append(zi.Kinds, &c)
		}
		out = append(out, zi)
		sessions = append(sessions, s.session)
	}
	z.mu.Unlock()
	for i := range out { // what each zone has ACKed, from its session (never under z.mu)
		if sessions[i] == nil {
			continue
		}
		counts := sessions[i].AckedCounts()
		for _, ki := range out[i].Kinds {
			ki.Known = counts[ki.Kind]
		}
		sort.Slice(out[i].Kinds, func(a, b int) bool { return out[i].Kinds[a].Kind < out[i].Kinds[b].Kind })
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

// AckedVersion returns the version of a resource (kind, xDS name) the zone has ACKed.
func (z *Zones) AckedVersion(zone, kind, name string) (string, bool) {
	if s := z.session(zone); s != nil {
		return s.AckedVersion(kind, name)
	}
	return "", false
}

// InventoryKeys returns the keys the zone has ACKed of the given kinds (nil: of every kind),
// and of the extra keys it holds.
func (z *Zones) InventoryKeys(zone string, kinds []string, extra []resource.Key) []resource.Key {
	s := z.session(zone)
	if s == nil {
		return nil
	}
	var out []resource.Key
	s.Acked(kinds, func(kind, name, _ string) { out = append(out, resource.KeyFromXDSName(kind, name)) })
	for _, k := range extra {
		if kinds == nil || slices.Contains(kinds, k.Kind) {
			continue // already there
		}
		if _, ok := s.AckedVersion(k.Kind, k.XDSName()); ok {
			out = append(out, k)
		}
	}
	return out
}

// InventoryDigest identifies what the zone holds now (the zero Digest for nothing, or an
// unknown zone).
func (z *Zones) InventoryDigest(zone string) Digest {
	if s := z.session(zone); s != nil {
		return s.Digest()
	}
	return Digest{}
}

// Versions returns what the zone holds: kind -> xDS name -> version. The caller owns the copy.
func (z *Zones) Versions(zone string) map[string]map[string]string {
	out := map[string]map[string]string{}
	if s := z.session(zone); s != nil {
		s.Acked(nil, func(kind, name, version string) {
			if out[kind] == nil {
				out[kind] = map[string]string{}
			}
			out[kind][name] = version
		})
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

package engine

import (
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/internal/shrink"
)

// Nodes is the zone table: per zone, whether it is connected and since when, and its session
// (its current stream's, or its last one's while the zone is within its grace), which says what
// the zone holds and what happened to each kind on the stream: Nodes keeps no copy of either. It
// keeps only the counters of the zone's earlier streams, so that they add up across reconnects.
type Nodes struct {
	cache *Cache

	mu    sync.Mutex // guards zones, peak, order and orderOK; released before a session's lock is taken
	zones map[string]*zoneState
	peak  shrink.Peak
	order []string // the zones' names, sorted, while orderOK (List)
	// orderOK: order holds every zone's name; a zone added or freed clears it.
	orderOK bool

	streamsGen atomic.Uint64 // StreamsGeneration
}

type zoneState struct {
	stream    int64
	connected bool
	since     time.Time
	session   *Session                // of stream; nil until it opened
	earlier   map[string]*TypeInsight // the counters of the zone's earlier streams, by kind
}

// TypeInsight is what happened to one kind on one zone.
type TypeInsight struct {
	TypeURL   string            `json:"kind"`
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

// NodeInsight is one zone's state.
type NodeInsight struct {
	Node      string         `json:"zone"`
	Connected bool           `json:"connected"`
	Stream    int64          `json:"stream,omitempty"`
	Since     time.Time      `json:"since"`
	Types     []*TypeInsight `json:"kinds"`
}

// NewNodes returns an empty zone table over the sessions of c.
func NewNodes(c *Cache) *Nodes { return &Nodes{cache: c, zones: map[string]*zoneState{}} }

// Observer is how the zone table hears of streams opening and closing. What happens on a stream
// is counted by its session.
func (z *Nodes) Observer() event.Observer {
	return event.Observer{StreamOpened: z.streamOpened, StreamClosed: z.streamClosed}
}

// streamOpened: a zone's new stream starts from what the zone reports; the counters of its last
// stream are added to its earlier ones.
func (z *Nodes) streamOpened(id int64, zone string) {
	defer z.streamsGen.Add(1)
	session := z.cache.Session(id)
	z.mu.Lock()
	s := z.zones[zone]
	if s == nil {
		s = &zoneState{earlier: map[string]*TypeInsight{}}
		z.zones[zone] = s
		z.orderOK = false
	}
	last := s.session
	s.stream, s.connected, s.since, s.session = id, true, time.Now(), session
	z.mu.Unlock()
	if last == nil || last == session {
		return
	}
	counts := last.Insight() // never under z.mu
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, ki := range counts {
		e := s.earlier[ki.TypeURL]
		if e == nil {
			e = &TypeInsight{TypeURL: ki.TypeURL}
			s.earlier[ki.TypeURL] = e
		}
		e.Sent += ki.Sent
		e.Responses += ki.Responses
		e.ACKs += ki.ACKs
		e.NACKs += ki.NACKs
	}
}

func (z *Nodes) streamClosed(id int64, zone string) {
	defer z.streamsGen.Add(1)
	z.mu.Lock()
	defer z.mu.Unlock()
	if s := z.zones[zone]; s != nil && s.stream == id {
		s.connected = false
		s.since = time.Now()
	}
}

// session is the zone's session (current, or its last within its grace), or nil.
func (z *Nodes) session(zone string) *Session {
	z.mu.Lock()
	defer z.mu.Unlock()
	if s := z.zones[zone]; s != nil {
		return s.session
	}
	return nil
}

// Expire frees the state of every zone whose last stream closed before the given time, and
// returns their names.
func (z *Nodes) Expire(before time.Time) []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []string
	for name, s := range z.zones {
		if !s.connected && s.since.Before(before) {
			delete(z.zones, name)
			z.orderOK = false
			out = append(out, name)
		}
	}
	z.zones = shrink.Map(z.zones, &z.peak)
	sort.Strings(out)
	return out
}

// Inventory returns what the zone has ACKed.
func (z *Nodes) Inventory(zone string) []Ref { return z.InventoryKeys(zone, nil, nil) }

// Insights returns every zone's state, sorted by zone and kind: per kind, what its current (or
// last) session counted, with the counters of its earlier streams added.
func (z *Nodes) Insights() []NodeInsight {
	z.mu.Lock()
	out := make([]NodeInsight, 0, len(z.zones))
	parts := make([]zoneParts, 0, len(z.zones))
	for name, s := range z.zones {
		out = append(out, NodeInsight{Node: name, Connected: s.connected, Stream: s.stream, Since: s.since})
		parts = append(parts, s.parts())
	}
	z.mu.Unlock()
	for i := range out { // never under z.mu: a session's lock
		out[i].Types = parts[i].kinds()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// List returns every zone's state without its kinds, sorted by zone: what a summary of many
// zones needs, at the cost of the zone table alone (the order is kept until a zone comes or goes).
func (z *Nodes) List() []NodeInsight {
	z.mu.Lock()
	defer z.mu.Unlock()
	if !z.orderOK {
		z.order = z.order[:0]
		for name := range z.zones {
			z.order = append(z.order, name)
		}
		slices.Sort(z.order)
		z.orderOK = true
	}
	out := make([]NodeInsight, len(z.order))
	for i, name := range z.order {
		s := z.zones[name]
		out[i] = NodeInsight{Node: name, Connected: s.connected, Stream: s.stream, Since: s.since}
	}
	return out
}

// Insight is one zone's state, as Insights gives it, and whether the zone is known.
func (z *Nodes) Insight(zone string) (NodeInsight, bool) {
	z.mu.Lock()
	s, ok := z.zones[zone]
	if !ok {
		z.mu.Unlock()
		return NodeInsight{}, false
	}
	zi := NodeInsight{Node: zone, Connected: s.connected, Stream: s.stream, Since: s.since}
	p := s.parts()
	z.mu.Unlock()
	zi.Types = p.kinds()
	return zi, true
}

// zoneParts is what a zone's kinds are made of: its session and its earlier streams' counters,
// copied under the table's lock.
type zoneParts struct {
	session *Session
	earlier []TypeInsight
}

func (s *zoneState) parts() zoneParts {
	p := zoneParts{session: s.session}
	for _, ki := range s.earlier {
		p.earlier = append(p.earlier, *ki)
	}
	return p
}

// kinds is the zone's kinds, sorted: its session's counters with its earlier streams' added.
// Call without the table's lock (it takes the session's).
func (p zoneParts) kinds() []*TypeInsight {
	byKind := map[string]*TypeInsight{}
	if p.session != nil {
		for _, ki := range p.session.Insight() {
			byKind[ki.TypeURL] = ki
		}
	}
	for _, e := range p.earlier {
		ki := byKind[e.TypeURL]
		if ki == nil {
			ki = &TypeInsight{TypeURL: e.TypeURL}
			byKind[e.TypeURL] = ki
		}
		ki.Sent += e.Sent
		ki.Responses += e.Responses
		ki.ACKs += e.ACKs
		ki.NACKs += e.NACKs
	}
	out := make([]*TypeInsight, 0, len(byKind))
	for _, ki := range byKind {
		out = append(out, ki)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].TypeURL < out[b].TypeURL })
	return out
}

// StreamsGeneration changes whenever a stream opens or closes: two equal readings mean the same
// zones are connected on the same streams (Streams would list the same).
func (z *Nodes) StreamsGeneration() uint64 { return z.streamsGen.Load() }

// Streams returns the connected zones with their stream and since when, sorted by zone, without
// their kinds: what a replica's heartbeat records, at the cost of the zone table alone.
func (z *Nodes) Streams() []NodeInsight {
	all := z.List()
	out := all[:0]
	for _, zi := range all {
		if zi.Connected {
			out = append(out, zi)
		}
	}
	return out
}

// Known reports whether the zone is in the table: connected, or left within its grace.
func (z *Nodes) Known(zone string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	_, ok := z.zones[zone]
	return ok
}

// AckedVersion returns the version of a resource (kind, xDS name) the zone has ACKed.
func (z *Nodes) AckedVersion(zone, kind, name string) (string, bool) {
	if s := z.session(zone); s != nil {
		return s.AckedVersion(kind, name)
	}
	return "", false
}

// InventoryKeys returns what the zone has ACKed of the given types (nil: of every type), and
// which of extra it holds.
func (z *Nodes) InventoryKeys(zone string, types []string, extra []Ref) []Ref {
	s := z.session(zone)
	if s == nil {
		return nil
	}
	var out []Ref
	s.Acked(types, func(typeURL, name, _ string) { out = append(out, Ref{TypeURL: typeURL, Name: name}) })
	for _, r := range extra {
		if types == nil || slices.Contains(types, r.TypeURL) {
			continue // already there
		}
		if _, ok := s.AckedVersion(r.TypeURL, r.Name); ok {
			out = append(out, r)
		}
	}
	return out
}

// InventoryDigest identifies what the zone holds now (the zero Digest for nothing, or an
// unknown zone).
func (z *Nodes) InventoryDigest(zone string) Digest {
	if s := z.session(zone); s != nil {
		return s.Digest()
	}
	return Digest{}
}

// Versions returns what the zone holds: kind -> xDS name -> version. The caller owns the copy.
func (z *Nodes) Versions(zone string) map[string]map[string]string {
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
func (z *Nodes) Connected() []string {
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

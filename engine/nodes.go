package engine

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/internal/shrink"
)

// Nodes is the node table: per node, whether it is connected and since when, and its session
// (its current stream's, or its last one's within its grace), which says what the node holds and
// counts what happened on the stream. Nodes adds the counters of the node's earlier streams.
type Nodes struct {
	cache *Cache

	mu      sync.Mutex // guards nodes, peak, order and orderOK; released before a session's lock is taken
	nodes   map[string]*nodeState
	peak    shrink.Peak
	order   []string // the node ids, sorted, while orderOK (List)
	orderOK bool     // cleared when a node is added or freed

	streamsGen atomic.Uint64 // StreamsGeneration
}

type nodeState struct {
	stream    int64
	connected bool
	since     time.Time
	session   *Session                // of stream; nil until it opened
	earlier   map[string]*TypeInsight // the counters of the node's earlier streams, by type URL
}

// TypeInsight is what happened to one type on one node's streams.
type TypeInsight struct {
	TypeURL   string `json:"typeUrl"`
	Sent      int64  `json:"sent"`      // resources and removed names sent
	Responses int64  `json:"responses"` // responses sent
	ACKs      int64  `json:"acks"`
	NACKs     int64  `json:"nacks"`
	Resent    int64  `json:"resent,omitempty"` // resources sent again although the node was sent their version (Cache.Resend)
	// LastError and Rejected are the last NACK's error detail and the names it rejected; the
	// ACK of a response that carries a rejected name clears it, and LastError with the last one.
	LastError string            `json:"lastError,omitempty"`
	Rejected  []event.Rejection `json:"rejected,omitempty"`
	Known     int               `json:"known"`           // resources the node has ACKed, and holds now
	Holds     []Hold            `json:"holds,omitempty"` // what a Withholder keeps from the node now, by name
}

func addCounts(m map[string]*TypeInsight, ki *TypeInsight) {
	e := m[ki.TypeURL]
	if e == nil {
		e = &TypeInsight{TypeURL: ki.TypeURL}
		m[ki.TypeURL] = e
	}
	e.Sent += ki.Sent
	e.Responses += ki.Responses
	e.ACKs += ki.ACKs
	e.NACKs += ki.NACKs
	e.Resent += ki.Resent
}

// NodeInsight is one node's state: whether a stream of it is open (Stream) or since when it is
// not, and, from Insights and Insight, what happened to each type.
type NodeInsight struct {
	Node      string         `json:"node"`
	Connected bool           `json:"connected"`
	Stream    int64          `json:"stream,omitempty"`
	Since     time.Time      `json:"since"` // when the stream opened, or the last one closed
	Types     []*TypeInsight `json:"types"`
}

func (s *nodeState) insight(name string) NodeInsight {
	return NodeInsight{Node: name, Connected: s.connected, Stream: s.stream, Since: s.since}
}

// NewNodes returns an empty node table over the sessions of c.
func NewNodes(c *Cache) *Nodes { return &Nodes{cache: c, nodes: map[string]*nodeState{}} }

// Observer is how the node table hears of streams opening and closing.
func (n *Nodes) Observer() event.Observer {
	return event.Observer{StreamOpened: n.streamOpened, StreamClosed: n.streamClosed}
}

// streamOpened records a node's new stream, and adds the counters of its last one to its earlier ones.
func (n *Nodes) streamOpened(id int64, zone string) {
	defer n.streamsGen.Add(1)
	session := n.cache.Session(id)
	n.mu.Lock()
	s := n.nodes[zone]
	if s == nil {
		s = &nodeState{earlier: map[string]*TypeInsight{}}
		n.nodes[zone] = s
		n.orderOK = false
	}
	last := s.session
	s.stream, s.connected, s.since, s.session = id, true, time.Now(), session
	n.mu.Unlock()
	if last == nil || last == session {
		return
	}
	counts := last.Insight() // never under n.mu
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ki := range counts {
		addCounts(s.earlier, ki)
	}
}

func (n *Nodes) streamClosed(id int64, zone string) {
	defer n.streamsGen.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.nodes[zone]; s != nil && s.stream == id {
		s.connected, s.since = false, time.Now()
	}
}

// session is the node's session (current, or its last within its grace), or nil.
func (n *Nodes) session(zone string) *Session {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.nodes[zone]; s != nil {
		return s.session
	}
	return nil
}

// Expire frees every node whose last stream closed before the given time; it returns their ids, sorted.
func (n *Nodes) Expire(before time.Time) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name, s := range n.nodes {
		if !s.connected && s.since.Before(before) {
			delete(n.nodes, name)
			n.orderOK = false
			out = append(out, name)
		}
	}
	n.nodes = shrink.Map(n.nodes, &n.peak)
	slices.Sort(out)
	return out
}

// Inventory returns what the node has ACKed.
func (n *Nodes) Inventory(node string) []Ref { return n.InventoryKeys(node, nil, nil) }

// Insights returns every node's state, sorted by node id and type URL: per type, what its current
// (or last) session counted, with the counters of its earlier streams added.
func (n *Nodes) Insights() []NodeInsight {
	n.mu.Lock()
	out := make([]NodeInsight, 0, len(n.nodes))
	parts := make([]nodeParts, 0, len(n.nodes))
	for name, s := range n.nodes {
		out = append(out, s.insight(name))
		parts = append(parts, s.parts())
	}
	n.mu.Unlock()
	for i := range out { // never under n.mu: a session's lock
		out[i].Types = parts[i].kinds()
	}
	slices.SortFunc(out, func(a, b NodeInsight) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// List returns every node's state without its types, sorted by node id, from the node table alone.
func (n *Nodes) List() []NodeInsight {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.orderOK {
		n.order = slices.AppendSeq(n.order[:0], maps.Keys(n.nodes))
		slices.Sort(n.order)
		n.orderOK = true
	}
	out := make([]NodeInsight, len(n.order))
	for i, name := range n.order {
		out[i] = n.nodes[name].insight(name)
	}
	return out
}

// Insight is one node's state, as Insights gives it, and whether the node is known.
func (n *Nodes) Insight(node string) (NodeInsight, bool) {
	n.mu.Lock()
	s, ok := n.nodes[node]
	if !ok {
		n.mu.Unlock()
		return NodeInsight{}, false
	}
	zi, p := s.insight(node), s.parts()
	n.mu.Unlock()
	zi.Types = p.kinds()
	return zi, true
}

// nodeParts is a node's session and a copy of its earlier streams' counters, taken under n.mu.
type nodeParts struct {
	session *Session
	earlier []TypeInsight
}

func (s *nodeState) parts() nodeParts {
	p := nodeParts{session: s.session}
	for _, ki := range s.earlier {
		p.earlier = append(p.earlier, *ki)
	}
	return p
}

// kinds is the node's types, sorted: its session's counters with its earlier streams' added.
// Call without n.mu (it takes the session's lock).
func (p nodeParts) kinds() []*TypeInsight {
	byKind := map[string]*TypeInsight{}
	if p.session != nil {
		for _, ki := range p.session.Insight() {
			byKind[ki.TypeURL] = ki
		}
	}
	for i := range p.earlier {
		addCounts(byKind, &p.earlier[i])
	}
	out := slices.AppendSeq(make([]*TypeInsight, 0, len(byKind)), maps.Values(byKind))
	slices.SortFunc(out, func(a, b *TypeInsight) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	return out
}

// StreamsGeneration changes whenever a stream opens or closes (Streams may list something else).
func (n *Nodes) StreamsGeneration() uint64 { return n.streamsGen.Load() }

// Streams returns List's connected nodes.
func (n *Nodes) Streams() []NodeInsight {
	return slices.DeleteFunc(n.List(), func(zi NodeInsight) bool { return !zi.Connected })
}

// Known reports whether the node is in the table: connected, or left within its grace.
func (n *Nodes) Known(node string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.nodes[node]
	return ok
}

// AckedVersion returns the version of a resource (type URL, xDS name) the node has ACKed.
func (n *Nodes) AckedVersion(node, typeURL, name string) (string, bool) {
	if s := n.session(node); s != nil {
		return s.AckedVersion(typeURL, name)
	}
	return "", false
}

// InventoryKeys returns what the node has ACKed of the given types (nil: of every type), and
// which of extra it holds.
func (n *Nodes) InventoryKeys(node string, types []string, extra []Ref) []Ref {
	s := n.session(node)
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

// InventoryDigest identifies what the node holds now (zero: nothing, or an unknown node).
func (n *Nodes) InventoryDigest(node string) Digest {
	if s := n.session(node); s != nil {
		return s.Digest()
	}
	return Digest{}
}

// Versions returns a copy of what the node holds: type URL -> xDS name -> version.
func (n *Nodes) Versions(node string) map[string]map[string]string {
	out := map[string]map[string]string{}
	if s := n.session(node); s != nil {
		s.Acked(nil, func(typeURL, name, version string) {
			if out[typeURL] == nil {
				out[typeURL] = map[string]string{}
			}
			out[typeURL][name] = version
		})
	}
	return out
}

// Connected returns the ids of the nodes with an open stream, sorted.
func (n *Nodes) Connected() []string {
	var out []string
	for _, zi := range n.Streams() {
		out = append(out, zi.Node)
	}
	return out
}

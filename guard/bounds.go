package guard

// The bounds of what one client stream's requests may make the guard, and the server it wraps,
// hold: checked in the request callbacks, which go-control-plane calls before it stores a
// request's names in the stream's subscription.

import (
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"log/slog"

	"github.com/kds-host/kds-host/engine/nack"
)

// The defaults of Options' bounds.
const (
	DefaultMaxTypesPerStream = 32
	DefaultMaxNamesPerStream = 100_000
	DefaultMaxStreamsPerNode = 64
)

// bounds are Options' bounds with their defaults; perNode 0 is no bound.
type bounds struct {
	types, names, perNode int
}

func (o Options) bounds() bounds {
	b := bounds{types: o.MaxTypesPerStream, names: o.MaxNamesPerStream, perNode: o.MaxStreamsPerNode}
	if b.types <= 0 {
		b.types = DefaultMaxTypesPerStream
	}
	if b.names <= 0 {
		b.names = DefaultMaxNamesPerStream
	}
	switch {
	case b.perNode == 0:
		b.perNode = DefaultMaxStreamsPerNode
	case b.perNode < 0:
		b.perNode = 0
	}
	return b
}

// askedType is what a stream's requests asked of one type, as admit counted it: the names it
// subscribes to, and those of its initial_resource_versions not among them (delta; counted for
// the stream's life).
type askedType struct {
	subscribed, initial int
}

// request is what admit reads of a SotW or delta request.
type request struct {
	node        *core.Node
	typeURL     string
	subscribe   []string          // SotW: every name it asks for (it replaces the last request's)
	unsubscribe []string          // delta
	initial     map[string]string // delta: read on the type's first request
	sotw        bool
}

// admit checks a request against its stream's bounds: the streams of its node (on the stream's
// first request), the types the stream asks for, and the names, across its types. It refuses the
// request with ResourceExhausted, counted and logged, before the server stores any of it, and
// records what it admits.
func (s *session) admit(r request) error {
	err := s.admitNode(r.node)
	if err == nil {
		err = s.admitNames(r)
	}
	if err != nil {
		s.g.refused("limit", s.nodeID(r.node), err)
	}
	return err
}

// admitNode counts the stream against its node's streams, on its first request.
func (s *session) admitNode(node *core.Node) error {
	s.mu.Lock()
	counted := s.counted
	s.mu.Unlock()
	if counted {
		return nil
	}
	id := node.GetId()
	g := s.g
	g.mu.Lock()
	if g.bounds.perNode > 0 && g.nodes[id] >= g.bounds.perNode {
		n := g.nodes[id]
		g.mu.Unlock()
		return status.Errorf(codes.ResourceExhausted, "node %q has %d streams open, its bound (guard.Options.MaxStreamsPerNode)", nack.Truncate(id, 128), n)
	}
	g.nodes[id]++
	g.mu.Unlock()
	s.mu.Lock()
	s.counted, s.countedAs = true, id
	s.mu.Unlock()
	return nil
}

// uncount takes a closed stream out of its node's streams.
func (g *Guard) uncount(s *session) {
	s.mu.Lock()
	counted, id := s.counted, s.countedAs
	s.counted = false
	s.mu.Unlock()
	if !counted {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.nodes[id]--; g.nodes[id] <= 0 {
		delete(g.nodes, id)
	}
}

// admitNames checks the types and names a request asks for.
func (s *session) admitNames(r request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.g.bounds
	prev, asked := s.asked[r.typeURL]
	if !asked && len(s.asked) >= b.types {
		return status.Errorf(codes.ResourceExhausted, "a stream may ask for %d types at most; %q is one more (guard.Options.MaxTypesPerStream)", b.types, nack.Truncate(r.typeURL, 128))
	}
	others := 0
	for t, a := range s.asked {
		if t != r.typeURL {
			others += a.subscribed + a.initial
		}
	}
	// live is what the server's subscription holds of the type now: a delta request changes it.
	var live map[string]struct{}
	if ts := s.types[r.typeURL]; ts != nil && ts.sub != nil && !r.sotw {
		live = ts.sub.SubscribedResources()
	}
	next := askedType{initial: prev.initial}
	if !r.sotw {
		gone := map[string]struct{}{} // of live, what the request unsubscribes from
		for _, n := range r.unsubscribe {
			if _, ok := live[n]; ok {
				gone[n] = struct{}{}
			}
		}
		next.subscribed = len(live) - len(gone)
	}
	over := func() error {
		if others+next.subscribed+next.initial > b.names {
			return status.Errorf(codes.ResourceExhausted, "a stream may ask for %d resource names at most, across its types (guard.Options.MaxNamesPerStream)", b.names)
		}
		return nil
	}
	// seen holds at most the bound's names: the request is refused at the first name past it.
	seen := map[string]struct{}{}
	for _, n := range r.subscribe {
		if _, ok := live[n]; ok || n == "*" {
			continue
		}
		if _, ok := seen[n]; ok {
			continue
		}
		seen[n] = struct{}{}
		next.subscribed++
		if err := over(); err != nil {
			return err
		}
	}
	if !asked {
		for n := range r.initial {
			if _, ok := live[n]; ok {
				continue
			}
			if _, ok := seen[n]; ok {
				continue
			}
			seen[n] = struct{}{}
			next.initial++
			if err := over(); err != nil {
				return err
			}
		}
	}
	if s.asked == nil {
		s.asked = map[string]askedType{}
	}
	s.asked[r.typeURL] = next
	return nil
}

// nodeID is the node id a refusal names: the stream's, else its request's.
func (s *session) nodeID(node *core.Node) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.node != "" {
		return s.node
	}
	return nack.Truncate(node.GetId(), 128)
}

// refused counts a refused stream by reason, and logs it (refusalLines a second per reason).
func (g *Guard) refused(reason, node string, err error) {
	g.totals.add(&g.totals.refusals, reason)
	g.refusals.Log(reason, slog.LevelWarn, "xDS stream refused", "reason", reason, "node", node, "detail", status.Convert(err).Message())
}

// refusalLines bounds the log lines of refused streams of one reason a second.
const refusalLines = 5

package guard

// The bounds of what one client stream's requests may make the guard, and the server it wraps,
// hold: checked in the request callbacks, before go-control-plane stores a request's names.

import (
	"cmp"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// bounds reads the bounds of checked Options.
func (o Options) bounds() bounds {
	return bounds{types: cmp.Or(o.MaxTypesPerStream, DefaultMaxTypesPerStream), names: cmp.Or(o.MaxNamesPerStream, DefaultMaxNamesPerStream),
		perNode: max(cmp.Or(o.MaxStreamsPerNode, DefaultMaxStreamsPerNode), 0)}
}

// asked is what a stream's requests asked for, by type URL, as admitNames counted it.
type asked struct {
	types map[string]*askedType
}

// askedType is what a stream's requests asked of one type: the names it subscribes to, and
// those of its initial_resource_versions not among them (delta; counted for the stream's life).
type askedType struct {
	subscribed int
	live       map[string]struct{} // the names: as the server's subscription holds them (delta), as the last request listed them (SotW)
	initial    int
}

// request is what admitNames reads of a SotW or delta request.
type request struct {
	node        *core.Node
	typeURL     string
	subscribe   []string          // SotW: every name it asks for (it replaces the last request's)
	unsubscribe []string          // delta
	initial     map[string]string // delta: read on the type's first request
	sotw        bool
}

// admitNode counts a stream among its node's streams (perNode), on its first request, within
// the bound. Call with g.mu.
func (g *Guard) admitNode(node string) error {
	n := g.perNode[node]
	if g.bounds.perNode > 0 && n >= g.bounds.perNode {
		return status.Errorf(codes.ResourceExhausted, "node %q has %d streams open, its bound (guard.Options.MaxStreamsPerNode)", truncate(node), n)
	}
	g.perNode[node] = n + 1
	return nil
}

// admitNames checks the types and names a request asks for, and records what it admits.
func (a *asked) admitNames(b bounds, r request) error {
	prev := a.types[r.typeURL]
	switch {
	case prev == nil && len(a.types) >= b.types:
		return status.Errorf(codes.ResourceExhausted, "a stream may ask for %d types at most; %q is one more (guard.Options.MaxTypesPerStream)", b.types, truncate(r.typeURL))
	case prev != nil && !r.sotw && len(r.subscribe) == 0 && len(r.unsubscribe) == 0:
		return nil // an ACK or a NACK: nothing changes
	case prev != nil && r.sotw && sameNames(prev.live, r.subscribe):
		return nil // most often an ACK or a NACK, the same names asked for again
	}
	others := 0
	for t, at := range a.types {
		if t != r.typeURL {
			others += at.subscribed + at.initial
		}
	}
	next := askedType{}
	var live map[string]struct{} // what the server's subscription holds of the type now (delta)
	if prev != nil && !r.sotw {
		next.initial, live = prev.initial, prev.live
	}
	gone := map[string]struct{}{} // of live, what the request unsubscribes from
	for _, n := range r.unsubscribe {
		if _, ok := live[n]; ok {
			gone[n] = struct{}{}
		}
	}
	next.subscribed = len(live) - len(gone)
	// seen holds at most the bound's names: the request is refused at the first name past it.
	seen := map[string]struct{}{}
	count := func(n string, c *int) error {
		if _, ok := seen[n]; ok {
			return nil
		}
		seen[n] = struct{}{}
		*c++
		if others+next.subscribed+next.initial > b.names {
			return status.Errorf(codes.ResourceExhausted, "a stream may ask for %d resource names at most, across its types (guard.Options.MaxNamesPerStream)", b.names)
		}
		return nil
	}
	for _, n := range r.subscribe {
		_, held := live[n]
		_, going := gone[n]
		if (held && !going) || n == "*" {
			continue
		}
		if err := count(n, &next.subscribed); err != nil {
			return err
		}
	}
	if prev == nil {
		for n := range r.initial {
			if err := count(n, &next.initial); err != nil {
				return err
			}
		}
	}
	// Admitted: SotW's names are the request's; a delta subscription changes as the server's will.
	if live == nil {
		live = make(map[string]struct{}, len(r.subscribe))
	}
	for n := range gone {
		delete(live, n)
	}
	for _, n := range r.subscribe {
		if n != "*" || r.sotw {
			live[n] = struct{}{}
		}
	}
	next.live = live
	if a.types == nil {
		a.types = map[string]*askedType{}
	}
	a.types[r.typeURL] = &next
	return nil
}

// sameNames reports whether names are set's, each once.
func sameNames(set map[string]struct{}, names []string) bool {
	return len(names) == len(set) && !slices.ContainsFunc(names, func(n string) bool {
		_, ok := set[n]
		return !ok
	})
}

// truncate is a node id or type URL as an error message names it.
func truncate(s string) string { return nack.Truncate(s, 128) }

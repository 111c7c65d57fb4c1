package engine

// The bounds of what one client stream's requests may make the server hold, checked before
// anything of a request is stored, and what a closed stream's session lets go of.

import (
	"slices"
	"strings"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/engine/nack"
)

// DefaultMaxRequestBytes is the bound of one request of a client, as a gRPC server of the engine
// sets it (grpc.MaxRecvMsgSize) unless configured (kds-host: --kds-max-request): the bound of one
// response (Limits.MaxMessage). A client's requests are ACKs, NACKs and, when a stream starts,
// the names and versions of what it holds (about 60 bytes a name).
const DefaultMaxRequestBytes = 16 << 20

// bound checks a request against the stream's bounds before anything of it is stored: its type
// URL must be one the cache serves (else InvalidArgument); it must not name more resources
// than any request may (unmarshalRequest marked it), and the names it subscribes to and, on the
// type's first request, the names of its initial_resource_versions that the snapshot does not
// hold must keep the stream within MaxUnknownNames such names (else ResourceExhausted).
func (t *Tracker) bound(s *Session, req *discovery.DeltaDiscoveryRequest) error {
	kind := req.GetTypeUrl()
	if kind == "" {
		return status.Error(codes.InvalidArgument, "type_url is required: KDS is ADS, one type per kind")
	}
	if !t.cache.serves(kind) {
		return status.Errorf(codes.InvalidArgument, "type_url %q is not a kind this control plane serves (it serves %s)",
			nack.Truncate(kind, 128), nack.Truncate(strings.Join(t.cache.kinds, ", "), 512))
	}
	if n := markedNames(req); n > 0 {
		return status.Errorf(codes.ResourceExhausted, "this request names %d resources: more than a request may (the names of the largest kind this control plane serves, and --kds-max-unknown-names more)", n)
	}
	return s.admitNames(kind, req, t.limits.MaxUnknownNames)
}

// The fields of a DeltaDiscoveryRequest that name resources: subscribed, unsubscribed, initial
// versions, and the locators of both.
var requestNameFields = [...]protowire.Number{3, 4, 5, 8, 9}

// requestNamesField marks, among a request's unknown fields, how many names the request carried
// when unmarshalRequest decoded it without them: a field number no xDS message uses.
const requestNamesField = protowire.MaxValidNumber

// unmarshalRequest decodes a client's request, having counted the names in its encoding first. A
// request with more names than any request may carry (the largest type's, and MaxUnknownNames
// more) is decoded without them, marked with their count (requestNamesField), and refused by
// Tracker.bound: a request costs its bytes, not the maps its names would make (about 100 bytes a
// name, from 30 on the wire).
func (c *Cache) unmarshalRequest(data mem.BufferSlice, req *discovery.DeltaDiscoveryRequest) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	n := 0
	for rest := b; len(rest) > 0; {
		num, typ, size := protowire.ConsumeField(rest)
		if size < 0 {
			return proto.Unmarshal(b, req) // malformed: proto says how
		}
		if typ == protowire.BytesType && slices.Contains(requestNameFields[:], num) {
			n++
		}
		rest = rest[size:]
	}
	if n <= c.namesPerRequest(n) {
		return proto.Unmarshal(b, req)
	}
	kept := make([]byte, 0, 512)
	for rest := b; len(rest) > 0; {
		num, typ, size := protowire.ConsumeField(rest)
		if typ != protowire.BytesType || !slices.Contains(requestNameFields[:], num) {
			kept = append(kept, rest[:size]...)
		}
		rest = rest[size:]
	}
	kept = protowire.AppendVarint(protowire.AppendTag(kept, requestNamesField, protowire.VarintType), uint64(n))
	return proto.Unmarshal(kept, req)
}

// namesPerRequest is how many names a request may carry, when it carries n: any number up to
// MaxUnknownNames, else up to that and the size of the largest type served.
func (c *Cache) namesPerRequest(n int) int {
	limit := int(c.maxUnknown.Load())
	if n <= limit {
		return limit
	}
	largest := 0
	snap := c.snap.Load()
	for _, kind := range c.kinds {
		largest = max(largest, len(snap.Type(kind)))
	}
	return limit + largest
}

// markedNames is the count of names unmarshalRequest left out of req (0: none).
func markedNames(req *discovery.DeltaDiscoveryRequest) int {
	for b := req.ProtoReflect().GetUnknown(); len(b) > 0; {
		num, typ, size := protowire.ConsumeField(b)
		if size < 0 {
			return 0
		}
		if num == requestNamesField && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(b[protowire.SizeTag(num):])
			return int(v)
		}
		b = b[size:]
	}
	return 0
}

// admitNames counts the names a request subscribes to (and forgets those it unsubscribes from),
// and on the type's first request on the stream the names of its initial_resource_versions, that
// the snapshot does not hold; it refuses the request, changing nothing, as soon as the stream
// would hold more than max such names. What it counts it keeps (Session.unknown) until the
// stream closes.
func (s *Session) admitNames(kind string, req *discovery.DeltaDiscoveryRequest, max int) error {
	subscribe, unsubscribe := req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe()
	initial := req.GetInitialResourceVersions()
	if len(subscribe) == 0 && len(unsubscribe) == 0 && len(initial) == 0 {
		return nil // an ACK or a NACK, most requests: nothing to count, no lock taken
	}
	entries := s.snapshot().Type(kind)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.kinds.get(s.cache, kind); ks != nil && ks.requested {
		initial = nil // read on a type's first request only, as the delta server reads them
	}
	total := 0
	for _, names := range s.unknown {
		total += len(names)
	}
	known := s.unknown[kind]
	gone := 0 // of known, unsubscribed by this request
	for _, n := range unsubscribe {
		if _, ok := known[n]; ok {
			gone++
		}
	}
	// add holds at most max+1 names: the request is refused at the first name past the bound.
	add := map[string]struct{}{}
	count := func(n string) error {
		if _, ok := entries[n]; ok || n == "*" {
			return nil
		}
		if _, ok := known[n]; ok {
			return nil
		}
		if _, ok := add[n]; ok {
			return nil
		}
		add[n] = struct{}{}
		if total-gone+len(add) > max {
			return status.Errorf(codes.ResourceExhausted, "this stream would hold more than %d names the global does not hold, subscribed or reported in initial_resource_versions (--kds-max-unknown-names)", max)
		}
		return nil
	}
	for _, n := range subscribe {
		if err := count(n); err != nil {
			return err
		}
	}
	for n := range initial {
		if err := count(n); err != nil {
			return err
		}
	}
	for _, n := range unsubscribe {
		delete(known, n)
	}
	if len(add) == 0 {
		return nil
	}
	if known == nil {
		if s.unknown == nil {
			s.unknown = map[string]map[string]struct{}{}
		}
		known = make(map[string]struct{}, len(add))
		s.unknown[kind] = known
	}
	for n := range add {
		known[n] = struct{}{}
	}
	return nil
}

// release lets go of what a closed stream's session kept for the stream alone, so that what
// stays readable through the node's grace (what the node holds and ACKed, the insight counters)
// is all it costs: the names counted against the bounds, the answered watches and the
// stream loop's functions (which hold the loop's subscriptions, and so every name and initial
// version the node's requests carried), and the watches its responses in flight were answers
// to (each holds its request). Call once the stream has closed.
func (s *Session) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unknown = nil
	s.queue = nil
	if s.kick != nil {
		// A session go-control-plane's server serves never has them, and is signalled without
		// its lock (signal reads kick): no write here then.
		s.sendNow, s.kick = nil, nil
	}
	for i, r := range s.inflight {
		// A response's record, and the array of its one resource, live in the watch it answered
		// (watch.record, watch.answer); copies hold what the node was sent and had before, and
		// not the watch.
		c := *r
		c.resp = &discovery.DeltaDiscoveryResponse{TypeUrl: r.resp.TypeUrl, SystemVersionInfo: r.resp.SystemVersionInfo, Nonce: r.resp.Nonce,
			Resources: append([]*discovery.Resource(nil), r.resp.Resources...), RemovedResources: r.resp.RemovedResources}
		s.inflight[i] = &c
	}
	s.kinds.each(func(ks *kindState) {
		ks.watch, ks.sub, ks.dirty, ks.forced = nil, nil, nil, nil
	})
}

// nodeOf names, for a refusal, the node of a stream: the node it serves (node, once admitted),
// else the node its credentials prove, else the node id its request claims (shortened).
func nodeOf(s *Session, node, claimed string) string {
	switch {
	case node != "":
		return node
	case s.info.node != "":
		return s.info.node
	}
	return nack.Truncate(claimed, 64)
}

// refused reads a failed Recv of a stream: gRPC refused a request larger than the server's bound
// (ResourceExhausted, grpc.MaxRecvMsgSize; grpc-go has written that status to the client), which
// is counted and returned as the stream's end; nil for any other end.
func (t *Tracker) refused(s *Session, recvErr error) error {
	if status.Code(recvErr) != codes.ResourceExhausted {
		return nil
	}
	err := status.Errorf(codes.ResourceExhausted, "%s (--kds-max-request)", status.Convert(recvErr).Message())
	t.refuse(refusalOf(err), nodeOf(s, s.Node(), ""), err)
	return err
}

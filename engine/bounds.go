package engine

// The bounds of what one stream's requests may make the server hold.

import (
	"cmp"
	"iter"
	"maps"
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

// DefaultMaxRequestBytes is the bound of one request of a client (grpc.MaxRecvMsgSize) that a
// gRPC server of the engine sets unless configured (kds-host: --kds-max-request).
const DefaultMaxRequestBytes = 16 << 20

// bound checks a request before anything of it is stored: its type URL must be served, and its
// names within what a request may carry and the stream's MaxUnknownNames (admitNames).
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

// The fields of a DeltaDiscoveryRequest that name resources.
var requestNameFields = [...]protowire.Number{3, 4, 5, 8, 9}

// requestNamesField is the unknown field in which unmarshalRequest marks the names it left out.
const requestNamesField = protowire.MaxValidNumber

// unmarshalRequest decodes a client's request. One with more names than any request may carry is
// decoded without them, marked with their count (requestNamesField), for Tracker.bound to refuse.
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
	// A request may carry MaxUnknownNames names, and the size of the largest type more.
	limit := int(c.maxUnknown.Load())
	if n > limit {
		largest, snap := 0, c.snap.Load()
		for _, kind := range c.kinds {
			largest = max(largest, len(snap.Type(kind)))
		}
		limit += largest
	}
	if n <= limit {
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

// admitNames counts, in Session.unknown, the names the snapshot does not hold that a request
// subscribes to (forgetting those it unsubscribes from) or, on the type's first request, reports
// in initial_resource_versions; it refuses the request, changing nothing, once the stream would
// hold more than max.
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
	add := map[string]struct{}{}
	for _, names := range []iter.Seq[string]{slices.Values(subscribe), maps.Keys(initial)} {
		for n := range names {
			_, served := entries[n]
			_, had := known[n]
			_, added := add[n]
			if served || had || added || n == "*" {
				continue
			}
			add[n] = struct{}{}
			if total-gone+len(add) > max {
				return status.Errorf(codes.ResourceExhausted, "this stream would hold more than %d names the global does not hold, subscribed or reported in initial_resource_versions (--kds-max-unknown-names)", max)
			}
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
		s.unknown[kind] = add
		return nil
	}
	maps.Copy(known, add)
	return nil
}

// release lets go of what a closed stream's session kept for the stream alone: it keeps what
// the node ACKed and the insight. Call once the stream has closed.
func (s *Session) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unknown = nil
	s.queue = nil
	if s.kick != nil {
		// Not written otherwise: such a session is kicked without its lock.
		s.sendNow, s.kick = nil, nil
	}
	for i, r := range s.inflight {
		// A copy: r lives in the watch it answered. Not its Nonce, which the server may still write.
		c := *r
		c.resp = &discovery.DeltaDiscoveryResponse{TypeUrl: r.resp.TypeUrl, SystemVersionInfo: r.resp.SystemVersionInfo,
			Resources: append([]*discovery.Resource(nil), r.resp.Resources...), RemovedResources: r.resp.RemovedResources}
		s.inflight[i] = &c
	}
	s.kinds.each(func(ks *kindState) {
		ks.watch, ks.sub, ks.dirty, ks.forced = nil, nil, nil, nil
	})
}

// nodeOf names, for a refusal, the node of a stream: node once admitted, else the node its
// credentials prove, else the node id its request claims (shortened).
func nodeOf(s *Session, node, claimed string) string {
	return cmp.Or(node, s.info.node, nack.Truncate(claimed, 64))
}

// refused counts a failed Recv that refused a request over grpc.MaxRecvMsgSize and returns it
// as the stream's end; nil for any other end.
func (t *Tracker) refused(s *Session, recvErr error) error {
	if status.Code(recvErr) != codes.ResourceExhausted {
		return nil
	}
	err := status.Errorf(codes.ResourceExhausted, "%s (--kds-max-request)", status.Convert(recvErr).Message())
	t.refuse(refusalOf(err), nodeOf(s, s.Node(), ""), err)
	return err
}

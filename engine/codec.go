package engine

import (
	"fmt"
	"slices"
	"strconv"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// One encoding of a version for every stream that sends it: a delta response is its own small
// fields (nonce, type, version info, removals), encoded per stream, followed by its resources,
// each the bytes its snapshot entry encoded once. Protobuf fields may come in any order, and a
// repeated field's elements may be spread over the message, so a decoder reads the same
// message a plain encoding gives.

// resourcesField is DeltaDiscoveryResponse.resources' field number, and DiscoveryResponse's.
const resourcesField = 2

// encodeFrame is r as one element of a response's resources: its tag, its length, its bytes.
func encodeFrame(r *discovery.Resource) ([]byte, error) {
	n := proto.Size(r)
	b := make([]byte, 0, protowire.SizeTag(resourcesField)+protowire.SizeVarint(uint64(n))+n)
	b = protowire.AppendVarint(protowire.AppendTag(b, resourcesField, protowire.BytesType), uint64(n))
	return proto.MarshalOptions{}.MarshalAppend(b, r)
}

// responseCodec is the server's "proto" codec: a DeltaDiscoveryResponse's resources that are the
// current snapshot's entries are written from their entries' encoding; everything else is encoded
// as gRPC's own codec encodes it. A DeltaDiscoveryRequest's names are counted before they are
// decoded (Cache.unmarshalRequest).
type responseCodec struct {
	cache *Cache
	proto encoding.CodecV2
}

// Codec is the gRPC codec of a server that serves c: gRPC's proto codec, except that a delta
// response's resources of the current snapshot are written from the snapshot's one encoding of
// them, shared by every stream. A gRPC server that serves c installs it with
// grpc.ForceServerCodecV2 (kds-host's NewGRPCServer does).
func (c *Cache) Codec() encoding.CodecV2 { return newResponseCodec(c) }

func newResponseCodec(c *Cache) responseCodec {
	return responseCodec{cache: c, proto: encoding.GetCodecV2(protocodec.Name)}
}

func (responseCodec) Name() string { return protocodec.Name }

func (rc responseCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if req, ok := v.(*discovery.DeltaDiscoveryRequest); ok {
		return rc.cache.unmarshalRequest(data, req) // its names counted first (bounds.go)
	}
	return rc.proto.Unmarshal(data, v)
}

func (rc responseCodec) Marshal(v any) (mem.BufferSlice, error) {
	if sotw, ok := v.(*discovery.DiscoveryResponse); ok {
		if b := rc.cache.encodeSotwAll(sotw); b != nil {
			return b, nil
		}
		return rc.proto.Marshal(v)
	}
	resp, ok := v.(*discovery.DeltaDiscoveryResponse)
	if ok {
		if sa := rc.cache.answers.Load(); sa != nil {
			if sh := sa.kinds[resp.TypeUrl]; sh != nil && &sh.resp == resp && sh.wire != nil {
				return sh.wire, nil // every stream's: encoded once
			}
		}
	}
	if !ok || len(resp.Resources) == 0 || len(resp.ProtoReflect().GetUnknown()) > 0 {
		return rc.proto.Marshal(v)
	}
	snap := rc.cache.snap.Load()
	if len(resp.Resources) >= runMin {
		if run := snap.wire(resp.TypeUrl).run(resp.Resources); run != nil {
			// A run of the type's entries in name order (a full sync's response, or a part of one
			// cut at the message limit): one buffer, no copy.
			hb, err := encodeHead(resp)
			if err != nil {
				return nil, err
			}
			return mem.BufferSlice{mem.SliceBuffer(hb), mem.SliceBuffer(run)}, nil
		}
	}
	return encodeDelta(resp, snap.Type(resp.TypeUrl))
}

// encodeSotwAll is the encoding of a SotW response of every entry of its type in the snapshot
// served (its resources the snapshot's own list of them: a first answer, or a full state, of a
// client that asks for the whole type), written from the snapshot's one encoding of them; nil
// for any other response.
func (c *Cache) encodeSotwAll(resp *discovery.DiscoveryResponse) mem.BufferSlice {
	if len(resp.Resources) < runMin || len(resp.ProtoReflect().GetUnknown()) > 0 {
		return nil
	}
	ko := c.snap.Load().order(resp.TypeUrl)
	if len(ko.anys) != len(resp.Resources) || &ko.anys[0] != &resp.Resources[0] {
		return nil
	}
	ko.anysOnce.Do(func() {
		var b []byte
		for _, a := range ko.anys {
			n := proto.Size(a)
			b = protowire.AppendVarint(protowire.AppendTag(b, resourcesField, protowire.BytesType), uint64(n))
			var err error
			if b, err = (proto.MarshalOptions{}).MarshalAppend(b, a); err != nil {
				return // encoded per response
			}
		}
		ko.anysRun = b
	})
	if ko.anysRun == nil {
		return nil
	}
	head, err := proto.Marshal(&discovery.DiscoveryResponse{VersionInfo: resp.VersionInfo, Canary: resp.Canary, TypeUrl: resp.TypeUrl,
		Nonce: resp.Nonce, ControlPlane: resp.ControlPlane, ResourceErrors: resp.ResourceErrors})
	if err != nil {
		return nil
	}
	return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(ko.anysRun)}
}

// encodeDelta is resp's encoding: its head, then each resource from its entry's frame when it
// is the entry of entries, else encoded here (a version the snapshot has moved past, a
// version-only resource).
func encodeDelta(resp *discovery.DeltaDiscoveryResponse, entries map[string]*Entry) (mem.BufferSlice, error) {
	hb, err := encodeHead(resp)
	if err != nil {
		return nil, err
	}
	out := make(mem.BufferSlice, 0, 1+len(resp.Resources))
	out = append(out, mem.SliceBuffer(hb))
	for _, r := range resp.Resources {
		if e := entries[r.GetName()]; e != nil && e.Wire == r && e.frame != nil {
			out = append(out, e.frame)
			continue
		}
		f, err := encodeFrame(r)
		if err != nil {
			return nil, fmt.Errorf("encode delta response: %w", err)
		}
		out = append(out, mem.SliceBuffer(f))
	}
	return out, nil
}

// encodeHead encodes every field of resp but its resources (TestTheCodecKnowsEveryFieldOfADelta
// Response lists them): the strings the cache sets written directly, in field order as
// proto.Marshal writes them, into one buffer of their size; a response with any of the message
// fields the cache never sets goes through proto.Marshal.
func encodeHead(resp *discovery.DeltaDiscoveryResponse) ([]byte, error) {
	if resp.ControlPlane != nil || len(resp.RemovedResourceNames) > 0 || len(resp.ResourceErrors) > 0 {
		hb, err := proto.Marshal(&discovery.DeltaDiscoveryResponse{
			SystemVersionInfo:    resp.SystemVersionInfo,
			TypeUrl:              resp.TypeUrl,
			RemovedResources:     resp.RemovedResources,
			RemovedResourceNames: resp.RemovedResourceNames,
			Nonce:                resp.Nonce,
			ControlPlane:         resp.ControlPlane,
			ResourceErrors:       resp.ResourceErrors,
		})
		if err != nil {
			return nil, fmt.Errorf("encode delta response: %w", err)
		}
		return hb, nil
	}
	type field struct {
		num protowire.Number
		v   string
	}
	singles := [...]field{{1, resp.SystemVersionInfo}, {4, resp.TypeUrl}, {5, resp.Nonce}}
	const removed = 6
	size := 0
	for _, f := range singles {
		if f.v != "" {
			size += protowire.SizeTag(f.num) + protowire.SizeBytes(len(f.v))
		}
	}
	for _, n := range resp.RemovedResources {
		size += protowire.SizeTag(removed) + protowire.SizeBytes(len(n))
	}
	b := make([]byte, 0, size)
	for _, f := range singles {
		if f.v != "" {
			b = protowire.AppendString(protowire.AppendTag(b, f.num, protowire.BytesType), f.v)
		}
	}
	for _, n := range resp.RemovedResources {
		b = protowire.AppendString(protowire.AppendTag(b, removed, protowire.BytesType), n)
	}
	return b, nil
}

// runMin is the fewest resources a response has for the codec to look for them in its type's
// encoding end to end: an update's response carries one or a few.
const runMin = 32

// kindWire is a type's entries encoded end to end in name order, made once per snapshot and
// type, the first time a response of many of them is sent: every stream's full sync of the type
// is then one slice of it.
type kindWire struct {
	once    sync.Once
	entries []*Entry       // in name order (Snapshot.order's)
	index   map[string]int // name -> its place in entries
	buf     []byte         // the entries' frames, end to end
	off     []int          // where each entry's frame starts in buf, and len(buf) last
}

// wire is the type's kindWire, made on first use.
func (s *Snapshot) wire(kind string) *kindWire {
	kw := perKind(s, &s.wires, kind)
	kw.once.Do(func() {
		entries := s.order(kind).entries
		size := 0
		for _, e := range entries {
			if e.frame == nil {
				return // an entry made elsewhere, with no encoding of its own: no run
			}
			size += e.frame.Len()
		}
		kw.entries, kw.index = entries, make(map[string]int, len(entries))
		kw.buf, kw.off = make([]byte, 0, size), make([]int, 0, len(entries)+1)
		for i, e := range entries {
			kw.index[e.Name] = i
			kw.off = append(kw.off, len(kw.buf))
			kw.buf = append(kw.buf, e.frame.ReadOnlyData()...)
		}
		kw.off = append(kw.off, len(kw.buf))
	})
	return kw
}

// run is the encoding of rs when they are consecutive entries of the type in name order, else
// nil.
func (kw *kindWire) run(rs []*discovery.Resource) []byte {
	i, ok := kw.index[rs[0].GetName()]
	if !ok || i+len(rs) > len(kw.entries) {
		return nil
	}
	for k, r := range rs {
		if kw.entries[i+k].Wire != r {
			return nil
		}
	}
	return kw.buf[kw.off[i]:kw.off[i+len(rs)]]
}

// One message for every stream: a write that changes a few names is most often answered to
// every stream of its type with the same response (the changed entries, the removed names).
// SetSnapshot makes that response once per changed type, encoded whole, nonce included; a
// stream of the engine's own loop whose answer is exactly it sends it as it is, and the codec
// writes its one encoding. Its nonce names the snapshot and the type ("<version>.<type's
// place>"), so it is unique on a stream as long as the stream does not have it in flight already
// (the cache then makes the stream its own response); a stream's own responses are numbered "1",
// "2", ...

// sharedAnswers are the shared responses of one snapshot, by type URL.
type sharedAnswers struct {
	snap  *Snapshot
	kinds map[string]*sharedAnswer
}

// sharedAnswer is one type's shared response and its encoding (nil: the codec encodes it per
// send, as any response).
type sharedAnswer struct {
	resp discovery.DeltaDiscoveryResponse
	wire mem.BufferSlice
}

// shareAnswers makes the shared response of each type that changed from the last snapshot
// (changed: type URL -> names), as version of snap.
func shareAnswers(snap *Snapshot, version string, kinds []string, changed map[string][]string) *sharedAnswers {
	sa := &sharedAnswers{snap: snap, kinds: make(map[string]*sharedAnswer, len(changed))}
	for i, kind := range kinds {
		names := changed[kind]
		if len(names) == 0 {
			continue
		}
		names = slices.Sorted(slices.Values(names))
		entries := snap.Type(kind)
		sh := &sharedAnswer{resp: discovery.DeltaDiscoveryResponse{
			TypeUrl: kind, SystemVersionInfo: version, Nonce: version + "." + strconv.Itoa(i)}}
		for _, n := range names {
			if e := entries[n]; e != nil {
				sh.resp.Resources = append(sh.resp.Resources, e.Wire)
			} else {
				sh.resp.RemovedResources = append(sh.resp.RemovedResources, n)
			}
		}
		// Not encoded (nil): the codec encodes it per send, and says why.
		sh.wire, _ = encodeDelta(&sh.resp, entries)
		sa.kinds[kind] = sh
	}
	return sa
}

// is reports whether a response of resources and removed (both in name order) is sh's.
func (sh *sharedAnswer) is(resources []*discovery.Resource, removed []string) bool {
	return slices.Equal(resources, sh.resp.Resources) && slices.Equal(removed, sh.resp.RemovedResources)
}

// shared is the shared response of the type for snap, if the cache made one.
func (c *Cache) shared(snap *Snapshot, kind string) *sharedAnswer {
	if sa := c.answers.Load(); sa != nil && sa.snap == snap {
		return sa.kinds[kind]
	}
	return nil
}

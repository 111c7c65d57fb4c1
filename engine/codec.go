package engine

import (
	"fmt"
	"slices"
	"strconv"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// resourcesField is DeltaDiscoveryResponse.resources' field number, and DiscoveryResponse's.
const resourcesField = 2

// encodeFrame is r as one element of a response's resources: its tag, its length, its bytes.
func encodeFrame(r *discovery.Resource) ([]byte, error) {
	n := proto.Size(r)
	return appendFrame(make([]byte, 0, protowire.SizeTag(resourcesField)+protowire.SizeVarint(uint64(n))+n), r, n)
}

// appendFrame appends m, of encoded size n, to b as one element of a response's resources.
func appendFrame(b []byte, m proto.Message, n int) ([]byte, error) {
	b = protowire.AppendVarint(protowire.AppendTag(b, resourcesField, protowire.BytesType), uint64(n))
	return proto.MarshalOptions{}.MarshalAppend(b, m)
}

// responseCodec is the server's "proto" codec (Cache.Codec).
type responseCodec struct {
	cache *Cache
	proto encoding.CodecV2
}

// Codec is the gRPC codec of a server that serves c: gRPC's proto codec, except that resources of
// the current snapshot are written from its one encoding of them, shared by every stream, and a
// delta request's names are counted before they are decoded. Install it with grpc.ForceServerCodecV2.
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
	if sa := rc.cache.answers.Load(); ok && sa != nil {
		if sh := sa.kinds[resp.TypeUrl]; sh != nil && &sh.resp == resp && sh.wire != nil {
			return sh.wire, nil // every stream's: encoded once
		}
	}
	if !ok || len(resp.Resources) == 0 || len(resp.ProtoReflect().GetUnknown()) > 0 {
		return rc.proto.Marshal(v)
	}
	snap := rc.cache.snap.Load()
	if len(resp.Resources) >= runMin {
		if run := snap.order(resp.TypeUrl).runOf(resp.Resources); run != nil { // a full sync, or a part of one
			hb, err := encodeHead(resp)
			if err != nil {
				return nil, err
			}
			return mem.BufferSlice{mem.SliceBuffer(hb), mem.SliceBuffer(run)}, nil
		}
	}
	return encodeDelta(resp, snap.Type(resp.TypeUrl))
}

// encodeSotwAll encodes a SotW response whose resources are the served snapshot's list of every
// entry of its type (kindOrder.anys) from one encoding of them; nil for any other response.
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
			var err error
			if b, err = appendFrame(b, a, proto.Size(a)); err != nil {
				return // encoded per response
			}
		}
		ko.anysRun = b
	})
	if ko.anysRun == nil {
		return nil
	}
	var head []byte
	if resp.Canary || resp.ControlPlane != nil || len(resp.ResourceErrors) > 0 {
		var err error
		head, err = proto.Marshal(&discovery.DiscoveryResponse{VersionInfo: resp.VersionInfo, Canary: resp.Canary, TypeUrl: resp.TypeUrl,
			Nonce: resp.Nonce, ControlPlane: resp.ControlPlane, ResourceErrors: resp.ResourceErrors})
		if err != nil {
			return nil
		}
	} else {
		head = headOf([...]headField{{1, resp.VersionInfo}, {4, resp.TypeUrl}, {5, resp.Nonce}}, nil)
	}
	return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(ko.anysRun)}
}

// encodeDelta encodes resp, each resource from its entry's frame when it is the entry of entries.
func encodeDelta(resp *discovery.DeltaDiscoveryResponse, entries map[string]*Entry) (mem.BufferSlice, error) {
	hb, err := encodeHead(resp)
	if err != nil {
		return nil, err
	}
	out := append(make(mem.BufferSlice, 0, 1+len(resp.Resources)), mem.SliceBuffer(hb))
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

// encodeHead encodes every field of resp but its resources, as proto.Marshal does
// (TestTheCodecKnowsEveryFieldOfADeltaResponse lists them).
func encodeHead(resp *discovery.DeltaDiscoveryResponse) ([]byte, error) {
	if resp.ControlPlane != nil || len(resp.RemovedResourceNames) > 0 || len(resp.ResourceErrors) > 0 {
		hb, err := proto.Marshal(&discovery.DeltaDiscoveryResponse{SystemVersionInfo: resp.SystemVersionInfo, TypeUrl: resp.TypeUrl,
			RemovedResources: resp.RemovedResources, RemovedResourceNames: resp.RemovedResourceNames, Nonce: resp.Nonce,
			ControlPlane: resp.ControlPlane, ResourceErrors: resp.ResourceErrors})
		if err != nil {
			return nil, fmt.Errorf("encode delta response: %w", err)
		}
		return hb, nil
	}
	return headOf([...]headField{{1, resp.SystemVersionInfo}, {4, resp.TypeUrl}, {5, resp.Nonce}}, resp.RemovedResources), nil
}

// headField is a string field of a response's head.
type headField struct {
	num protowire.Number
	v   string
}

// headOf encodes singles (each unless empty) and removed (a delta response's field 6), in one
// buffer of their size, as proto.Marshal writes them.
func headOf(singles [3]headField, removed []string) []byte {
	const removedField = 6
	size := 0
	for _, f := range singles {
		if f.v != "" {
			size += protowire.SizeTag(f.num) + protowire.SizeBytes(len(f.v))
		}
	}
	for _, n := range removed {
		size += protowire.SizeTag(removedField) + protowire.SizeBytes(len(n))
	}
	b := make([]byte, 0, size)
	for _, f := range singles {
		if f.v != "" {
			b = protowire.AppendString(protowire.AppendTag(b, f.num, protowire.BytesType), f.v)
		}
	}
	for _, n := range removed {
		b = protowire.AppendString(protowire.AppendTag(b, removedField, protowire.BytesType), n)
	}
	return b
}

// runMin is the fewest resources a response has for the codec to look for them in a run (runOf).
const runMin = 32

// runOf is the encoding of rs when they are consecutive entries of ko in name order, else nil:
// every stream's full sync of the type is one slice of ko.run, made on first use.
func (ko *kindOrder) runOf(rs []*discovery.Resource) []byte {
	ko.runOnce.Do(func() {
		size := 0
		for _, e := range ko.entries {
			if e.frame == nil {
				return // an entry not encoded (EncodeWire): no run
			}
			size += e.frame.Len()
		}
		ko.index, ko.run, ko.off = make(map[string]int, len(ko.entries)), make([]byte, 0, size), make([]int, 0, len(ko.entries)+1)
		for i, e := range ko.entries {
			ko.index[e.Name] = i
			ko.off = append(ko.off, len(ko.run))
			ko.run = append(ko.run, e.frame.ReadOnlyData()...)
		}
		ko.off = append(ko.off, len(ko.run))
	})
	i, ok := ko.index[rs[0].GetName()]
	if !ok || i+len(rs) > len(ko.entries) {
		return nil
	}
	for k, r := range rs {
		if ko.entries[i+k].Wire != r {
			return nil
		}
	}
	return ko.run[ko.off[i]:ko.off[i+len(rs)]]
}

// sharedAnswers are one snapshot's responses to every stream in step, by type URL, made and
// encoded once; their nonce, "<version>.<type's place>", differs from a stream's own ("1", ...).
type sharedAnswers struct {
	snap  *Snapshot
	kinds map[string]*sharedAnswer
}

// sharedAnswer is one type's shared response and its encoding (nil: encoded per send).
type sharedAnswer struct {
	resp discovery.DeltaDiscoveryResponse
	wire mem.BufferSlice
}

// shareAnswers makes the shared response of each type changed (type URL -> names) in snap.
func shareAnswers(snap *Snapshot, version string, kinds []string, changed map[string][]string) *sharedAnswers {
	sa := &sharedAnswers{snap: snap, kinds: make(map[string]*sharedAnswer, len(changed))}
	for i, kind := range kinds {
		names := changed[kind]
		if len(names) == 0 {
			continue
		}
		entries := snap.Type(kind)
		sh := &sharedAnswer{resp: discovery.DeltaDiscoveryResponse{TypeUrl: kind, SystemVersionInfo: version, Nonce: version + "." + strconv.Itoa(i)}}
		for _, n := range slices.Sorted(slices.Values(names)) {
			if e := entries[n]; e != nil {
				sh.resp.Resources = append(sh.resp.Resources, e.Wire)
			} else {
				sh.resp.RemovedResources = append(sh.resp.RemovedResources, n)
			}
		}
		sh.wire, _ = encodeDelta(&sh.resp, entries) // on error nil: encoded per send
		sa.kinds[kind] = sh
	}
	return sa
}

// is reports whether a response of resources and removed (both in name order) is sh's.
func (sh *sharedAnswer) is(resources []*discovery.Resource, removed []string) bool {
	return slices.Equal(resources, sh.resp.Resources) && slices.Equal(removed, sh.resp.RemovedResources)
}

func (c *Cache) shared(snap *Snapshot, kind string) *sharedAnswer {
	if sa := c.answers.Load(); sa != nil && sa.snap == snap {
		return sa.kinds[kind]
	}
	return nil
}

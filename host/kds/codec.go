package kds

import (
	"fmt"

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

// resourcesField is DeltaDiscoveryResponse.resources' field number.
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
// as gRPC's own codec encodes it.
type responseCodec struct {
	cache *Cache
	proto encoding.CodecV2
}

func newResponseCodec(c *Cache) responseCodec {
	return responseCodec{cache: c, proto: encoding.GetCodecV2(protocodec.Name)}
}

func (responseCodec) Name() string { return protocodec.Name }

func (rc responseCodec) Unmarshal(data mem.BufferSlice, v any) error { return rc.proto.Unmarshal(data, v) }

func (rc responseCodec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*discovery.DeltaDiscoveryResponse)
	if !ok || len(resp.Resources) == 0 || len(resp.ProtoReflect().GetUnknown()) > 0 {
		return rc.proto.Marshal(v)
	}
	// Every field but the resources (responseFields in the tests lists them).
	head := &discovery.DeltaDiscoveryResponse{
		SystemVersionInfo:    resp.SystemVersionInfo,
		TypeUrl:              resp.TypeUrl,
		RemovedResources:     resp.RemovedResources,
		RemovedResourceNames: resp.RemovedResourceNames,
		Nonce:                resp.Nonce,
		ControlPlane:         resp.ControlPlane,
		ResourceErrors:       resp.ResourceErrors,
	}
	hb, err := proto.Marshal(head)
	if err != nil {
		return nil, fmt.Errorf("encode delta response: %w", err)
	}
	out := make(mem.BufferSlice, 0, 1+len(resp.Resources))
	out = append(out, mem.SliceBuffer(hb))
	entries := rc.cache.snap.Load().Kind(resp.TypeUrl)
	for _, r := range resp.Resources {
		if e := entries[r.GetName()]; e != nil && e.Wire == r && e.frame != nil {
			out = append(out, e.frame)
			continue
		}
		// Not the current snapshot's (a version the snapshot has moved past, a version-only
		// resource): encoded here.
		f, err := encodeFrame(r)
		if err != nil {
			return nil, fmt.Errorf("encode delta response: %w", err)
		}
		out = append(out, mem.SliceBuffer(f))
	}
	return out, nil
}

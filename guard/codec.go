package guard

import (
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// One encoding of a version for every stream that sends it. When the wrapped cache answers
// every node alike, every client that asks for all of a type gets the same resources: a SotW
// client in each response, a delta client in its first. The guard gives those responses one
// shared slice of them (served.anys, served.wires). Their encoding end to end is made once, the
// first time a response of them is sent; each stream's response is then its own few fields
// (version, type, nonce), encoded per stream, followed by that encoding. Protobuf fields may
// come in any order, and a repeated field's elements may follow the others, so a client decodes
// the same message a plain encoding gives.

// resourcesField is the field number of DiscoveryResponse.resources and of
// DeltaDiscoveryResponse.resources.
const resourcesField = 2

// Codec is gRPC's "proto" codec with one difference: a response that carries every resource
// the guard serves of its type, as every client that asks for the whole type gets it (SotW:
// each response; delta: the first), is written from one encoding of them shared by every
// stream, not encoded for each. Everything else is encoded as gRPC's own codec encodes it. It
// matters with a wrapped cache that answers every node alike (Options.NodeIndependent, or a
// LinearCache); with any other it changes nothing. Give it to the gRPC server that serves the
// guard's clients:
//
//	grpc.NewServer(grpc.ForceServerCodecV2(g.Codec()))
func (g *Guard) Codec() encoding.CodecV2 {
	return codec{g: g, proto: encoding.GetCodecV2(protocodec.Name)}
}

type codec struct {
	g     *Guard
	proto encoding.CodecV2
}

func (codec) Name() string { return protocodec.Name }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	var head proto.Message // the response but its resources, when they are a shared served's
	var run []byte
	var err error
	switch resp := v.(type) {
	case *discovery.DiscoveryResponse:
		if len(resp.Resources) == 0 || len(resp.ResourceErrors) > 0 || len(resp.ProtoReflect().GetUnknown()) > 0 {
			break
		}
		if sv := c.g.sharedServed(&resp.Resources[0]); sv != nil && len(sv.anys) == len(resp.Resources) {
			run, err = encodeRun(&sv.sotwRun, sv.anys)
			head = &discovery.DiscoveryResponse{VersionInfo: resp.VersionInfo, Canary: resp.Canary,
				TypeUrl: resp.TypeUrl, Nonce: resp.Nonce, ControlPlane: resp.ControlPlane}
		}
	case *discovery.DeltaDiscoveryResponse:
		if len(resp.Resources) == 0 || len(resp.ResourceErrors) > 0 || len(resp.ProtoReflect().GetUnknown()) > 0 {
			break
		}
		if sv := c.g.sharedServed(&resp.Resources[0]); sv != nil && len(sv.wires) == len(resp.Resources) {
			run, err = encodeRun(&sv.deltaRun, sv.wires)
			head = &discovery.DeltaDiscoveryResponse{SystemVersionInfo: resp.SystemVersionInfo, TypeUrl: resp.TypeUrl,
				RemovedResources: resp.RemovedResources, RemovedResourceNames: resp.RemovedResourceNames,
				Nonce: resp.Nonce, ControlPlane: resp.ControlPlane}
		}
	}
	if head == nil || err != nil { // not shared, or a resource that cannot be encoded: as gRPC does, its error too
		return c.proto.Marshal(v)
	}
	hb, err := proto.Marshal(head)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(hb), mem.SliceBuffer(run)}, nil
}

// shares maps each shared served's resources slices (by their first element's address) to the
// served, while a feed serves it: the codec finds a response's encoding there.
type shares struct {
	mu sync.RWMutex    // guards m
	m  map[any]*served // **anypb.Any or **discovery.Resource
}

// share makes sv's resources known to the codec, in place of was's (nil: none).
func (g *Guard) share(was, sv *served) {
	g.shares.mu.Lock()
	defer g.shares.mu.Unlock()
	if was != nil && len(was.anys) > 0 {
		delete(g.shares.m, &was.anys[0])
		delete(g.shares.m, &was.wires[0])
	}
	if sv != nil && len(sv.anys) > 0 {
		if g.shares.m == nil {
			g.shares.m = map[any]*served{}
		}
		g.shares.m[&sv.anys[0]] = sv
		g.shares.m[&sv.wires[0]] = sv
	}
}

// sharedServed is the shared served whose resources first is the first of, or nil.
func (g *Guard) sharedServed(first any) *served {
	g.shares.mu.RLock()
	defer g.shares.mu.RUnlock()
	return g.shares.m[first]
}

// run is a response's resources encoded end to end, made once, on first use.
type run struct {
	once sync.Once
	b    []byte
	err  error
}

// encodeRun is ms as a response's resources, end to end: r's, made on first use.
func encodeRun[M proto.Message](r *run, ms []M) ([]byte, error) {
	r.once.Do(func() {
		size := 0
		for _, m := range ms {
			n := proto.Size(m)
			size += protowire.SizeTag(resourcesField) + protowire.SizeVarint(uint64(n)) + n
		}
		b := make([]byte, 0, size)
		for _, m := range ms {
			b = protowire.AppendVarint(protowire.AppendTag(b, resourcesField, protowire.BytesType), uint64(proto.Size(m)))
			if b, r.err = (proto.MarshalOptions{}).MarshalAppend(b, m); r.err != nil {
				return
			}
		}
		r.b = b
	})
	return r.b, r.err
}

package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kds-host/kds-host/host/resource"
)

// The codec writes a response's current entries from their one encoding, and the zone decodes
// exactly the response that was sent, whatever else it carries.
func TestTheCodecWritesEntriesFromTheirOneEncoding(t *testing.T) {
	g := NewWithT(t)
	var b testSnapshots
	snap, err := b.Build([]resource.Resource{
		{Kind: resource.MeshKind, Name: "m1", Generation: 1},
		{Kind: resource.MeshKind, Name: "m2", Generation: 1},
	})
	g.Expect(err).NotTo(HaveOccurred())
	c := NewCache([]string{resource.MeshKind})
	c.SetSnapshot(snap)
	m1, m2 := snap.Type(resource.MeshKind)["m1"], snap.Type(resource.MeshKind)["m2"]
	old := &discovery.Resource{Name: "m2", Version: "an older version", Resource: m2.Any} // not the snapshot's
	resp := &discovery.DeltaDiscoveryResponse{
		SystemVersionInfo: "7", TypeUrl: resource.MeshKind, Nonce: "12",
		Resources:            []*discovery.Resource{m1.Wire, old, versionOnly("m3", "v3")},
		RemovedResources:     []string{"m4"},
		RemovedResourceNames: []*discovery.ResourceName{{Name: "m5"}},
		ControlPlane:         &corev3.ControlPlane{Identifier: "global"},
		ResourceErrors:       []*discovery.ResourceError{{ResourceName: &discovery.ResourceName{Name: "m6"}, ErrorDetail: &rpcstatus.Status{Code: 3}}},
	}
	data, err := newResponseCodec(c).Marshal(resp)
	g.Expect(err).NotTo(HaveOccurred())
	got := &discovery.DeltaDiscoveryResponse{}
	g.Expect(proto.Unmarshal(data.Materialize(), got)).To(Succeed())
	g.Expect(proto.Equal(got, resp)).To(BeTrue(), "decoded: %v", got)

	// The snapshot's entry is its frame itself, not a copy; the others were encoded here.
	g.Expect(data).To(HaveLen(4))
	shared := func(i int, e *Entry) bool {
		return unsafe.SliceData(data[i].ReadOnlyData()) == unsafe.SliceData(e.frame.ReadOnlyData())
	}
	g.Expect(shared(1, m1)).To(BeTrue(), "the current entry's encoding is shared")
	g.Expect(shared(2, m2)).To(BeFalse(), "a version the snapshot does not serve is encoded on its own")

	// Other messages, and a response with no resources, are encoded as gRPC's codec does.
	for _, m := range []proto.Message{&discovery.DeltaDiscoveryRequest{TypeUrl: resource.MeshKind}, &discovery.DeltaDiscoveryResponse{Nonce: "1", RemovedResources: []string{"m1"}}} {
		data, err := newResponseCodec(c).Marshal(m)
		g.Expect(err).NotTo(HaveOccurred())
		want, err := proto.Marshal(m)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(data.Materialize()).To(Equal(want))
	}
}

// The head of a response kds-host sends (its strings) is written directly, byte for byte as
// proto.Marshal writes the same fields; a UTF-8 check aside, which kds-host's names and versions
// pass by construction.
func TestTheHeadIsWhatProtoMarshalWrites(t *testing.T) {
	g := NewWithT(t)
	for _, resp := range []*discovery.DeltaDiscoveryResponse{
		{},
		{Nonce: "1"},
		{SystemVersionInfo: "42", TypeUrl: "MeshTimeout", Nonce: "7"},
		{TypeUrl: "Mesh", Nonce: "3", RemovedResources: []string{"m1", "", "m2"}},
		{SystemVersionInfo: strings.Repeat("v", 300), TypeUrl: "Mesh", Nonce: "9", RemovedResources: []string{strings.Repeat("n", 200)}},
		{TypeUrl: "Mesh", ControlPlane: &corev3.ControlPlane{Identifier: "global"}}, // through proto.Marshal
	} {
		got, err := encodeHead(resp)
		g.Expect(err).NotTo(HaveOccurred())
		want, err := proto.Marshal(resp) // no resources: the head is the whole message
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(want), "%v", resp)
		g.Expect(cap(got)).To(Equal(len(got)), "one buffer of the head's size")
	}
}

// The codec copies every field of a DeltaDiscoveryResponse but its resources into the part it
// encodes per stream: a field that go-control-plane's next version adds fails here until the codec
// copies it too.
func TestTheCodecKnowsEveryFieldOfADeltaResponse(t *testing.T) {
	copied := []protoreflect.FieldNumber{1, resourcesField, 4, 5, 6, 7, 8, 9}
	fields := (&discovery.DeltaDiscoveryResponse{}).ProtoReflect().Descriptor().Fields()
	var have []protoreflect.FieldNumber
	for i := range fields.Len() {
		have = append(have, fields.Get(i).Number())
	}
	slices.Sort(have)
	slices.Sort(copied)
	if !slices.Equal(have, copied) {
		t.Fatalf("DeltaDiscoveryResponse's fields are %v; responseCodec.Marshal copies %v", have, copied)
	}
}

// A response of many consecutive entries of a kind in name order (a full sync, or a part of one)
// is one slice of the kind's encoding end to end; any other is encoded resource by resource. The
// zone decodes the same message either way.
func TestTheCodecWritesARunOfEntriesAsOneSlice(t *testing.T) {
	g := NewWithT(t)
	var b testSnapshots
	var rs []resource.Resource
	for i := range 2 * runMin {
		rs = append(rs, resource.Resource{Kind: resource.MeshKind, Name: fmt.Sprintf("m%03d", i), Generation: 1})
	}
	snap, err := b.Build(rs)
	g.Expect(err).NotTo(HaveOccurred())
	c := NewCache([]string{resource.MeshKind})
	c.SetSnapshot(snap)
	wires := func(from, to int) []*discovery.Resource {
		var out []*discovery.Resource
		for _, n := range snap.Names(resource.MeshKind)[from:to] {
			out = append(out, snap.Type(resource.MeshKind)[n].Wire)
		}
		return out
	}
	gap := append(wires(0, runMin/2), wires(runMin/2+1, runMin+1)...)
	for _, tc := range []struct {
		name    string
		rs      []*discovery.Resource
		buffers int
	}{
		{"every entry", wires(0, 2*runMin), 2},
		{"a run in the middle", wires(3, 3+runMin), 2},
		{"a run with a gap", gap, 1 + len(gap)},
		{"too few for a run", wires(0, runMin-1), runMin},
	} {
		resp := &discovery.DeltaDiscoveryResponse{TypeUrl: resource.MeshKind, Nonce: "3", Resources: tc.rs}
		data, err := newResponseCodec(c).Marshal(resp)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(data).To(HaveLen(tc.buffers), tc.name)
		got := &discovery.DeltaDiscoveryResponse{}
		g.Expect(proto.Unmarshal(data.Materialize(), got)).To(Succeed())
		g.Expect(proto.Equal(got, resp)).To(BeTrue(), tc.name)
	}
}

// A SotW response of every entry of a type of the snapshot served (its resources the snapshot's
// own list) is written from one encoding of them, made once, and decodes as the plain encoding
// does; a response of a copy of the list, or of a snapshot no longer served, is encoded as any.
// The head copies every field of a DiscoveryResponse but its resources.
func TestTheCodecWritesASotwResponseOfAWholeTypeFromOneEncoding(t *testing.T) {
	g := NewWithT(t)
	have := (&discovery.DiscoveryResponse{}).ProtoReflect().Descriptor().Fields()
	g.Expect(have.Len()).To(Equal(7), "DiscoveryResponse's fields: encodeSotwAll's head copies them")
	var b testSnapshots
	var rs []resource.Resource
	for i := range 2 * runMin {
		rs = append(rs, resource.Resource{Kind: resource.MeshKind, Name: fmt.Sprintf("m%03d", i), Generation: 1})
	}
	snap, err := b.Build(rs)
	g.Expect(err).NotTo(HaveOccurred())
	c := NewCache([]string{resource.MeshKind})
	c.SetSnapshot(snap)
	codec := c.Codec()
	all := snap.order(resource.MeshKind).anys
	resp := &discovery.DiscoveryResponse{VersionInfo: "1.1", TypeUrl: resource.MeshKind, Nonce: "7", Resources: all}
	enc, err := codec.Marshal(resp)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(enc).To(HaveLen(2), "the head and the shared run")
	var got discovery.DiscoveryResponse
	g.Expect(proto.Unmarshal(enc.Materialize(), &got)).To(Succeed())
	g.Expect(proto.Equal(&got, resp)).To(BeTrue())
	for _, r := range []*discovery.DiscoveryResponse{resp, {TypeUrl: resource.MeshKind, Nonce: "8"}, {VersionInfo: strings.Repeat("v", 300), TypeUrl: resource.MeshKind},
		{TypeUrl: resource.MeshKind, Canary: true, Nonce: "9"}, {TypeUrl: resource.MeshKind, ControlPlane: &corev3.ControlPlane{Identifier: "x"}}} {
		withAll := proto.CloneOf(r)
		withAll.Resources = all
		e, err := codec.Marshal(withAll)
		g.Expect(err).NotTo(HaveOccurred())
		head := proto.CloneOf(r)
		head.Resources = nil
		want, err := proto.Marshal(head)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(e).To(HaveLen(2))
		g.Expect(e[0].ReadOnlyData()).To(Equal(want), "the head, as proto.Marshal writes it: %v", head)
	}
	again, err := codec.Marshal(&discovery.DiscoveryResponse{TypeUrl: resource.MeshKind, Nonce: "8", Resources: all})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(&again[1].ReadOnlyData()[0]).To(BeIdenticalTo(&enc[1].ReadOnlyData()[0]), "one encoding, shared")

	copied, err := codec.Marshal(&discovery.DiscoveryResponse{TypeUrl: resource.MeshKind, Resources: slices.Clone(all)})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(copied).NotTo(HaveLen(2))
	next, err := b.Update([]resource.Resource{{Kind: resource.MeshKind, Name: "m000", Generation: 2}}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	c.SetSnapshot(next)
	old, err := codec.Marshal(resp)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(proto.Unmarshal(old.Materialize(), &got)).To(Succeed())
	g.Expect(proto.Equal(&got, resp)).To(BeTrue(), "a snapshot no longer served: encoded as any")
}

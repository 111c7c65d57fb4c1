package main

import (
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/host/kds"
)

// The fleet's frames read what a full decode reads: the type, nonce and version, which of the
// bench's resources a response carries, and the target's update.
func TestAFrameReadsWhatAFullDecodeReads(t *testing.T) {
	g := NewWithT(t)
	rs := append(benchproc.Resources(5), benchproc.Updated(3))
	var wires []*discovery.Resource
	var anys []*anypb.Any
	for _, r := range rs[1:] { // the MeshTimeouts, the target twice: its first and its update 3
		e, err := kds.NewEntry(&r)
		g.Expect(err).NotTo(HaveOccurred())
		wires, anys = append(wires, e.Wire), append(anys, e.Any)
	}
	wires = append(wires, &discovery.Resource{Name: "default/not-a-timeout", Resource: anys[0]})
	delta, err := proto.Marshal(&discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "n7",
		SystemVersionInfo: "ignored", Resources: wires[6:7], RemovedResources: []string{"default/timeout-00009"}})
	g.Expect(err).NotTo(HaveOccurred())
	sotw, err := proto.Marshal(&discovery.DiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "n8", VersionInfo: "v9", Resources: anys})
	g.Expect(err).NotTo(HaveOccurred())

	codec := newFrameCodec()
	f := &frame{}
	// Split over several buffers, as gRPC hands a large message over.
	split := func(b []byte) mem.BufferSlice {
		return mem.BufferSlice{mem.SliceBuffer(b[:len(b)/3]), mem.SliceBuffer(b[len(b)/3 : 2*len(b)/3]), mem.SliceBuffer(b[2*len(b)/3:])}
	}
	g.Expect(codec.Unmarshal(split(delta), f)).To(Succeed())
	g.Expect(f.typeURL).To(Equal("MeshTimeout"))
	g.Expect(f.nonce).To(Equal("n7"))
	g.Expect(f.indexes).To(BeEmpty(), "a name the bench does not know is not counted")
	g.Expect(f.target).To(BeNil())

	all, err := proto.Marshal(&discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "n1", Resources: wires})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(all)}, f)).To(Succeed())
	g.Expect(f.indexes).To(Equal([]int{1, 2, 3, 4, 5, 1}))
	g.Expect(updateOf(f.target)).To(Equal(3), "the last of the target's copies is kept")

	fs := &frame{sotw: true}
	g.Expect(codec.Unmarshal(split(sotw), fs)).To(Succeed())
	g.Expect(fs.typeURL).To(Equal("MeshTimeout"))
	g.Expect(fs.nonce).To(Equal("n8"))
	g.Expect(fs.version).To(Equal("v9"))
	g.Expect(fs.indexes).To(Equal([]int{1, 2, 3, 4, 5, 1}))
	g.Expect(updateOf(fs.target)).To(Equal(3))

	g.Expect(codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(all[:len(all)-3])}, f)).To(MatchError(ContainSubstring("read a response")))

	// Anything else is the proto codec's.
	var resp discovery.DeltaDiscoveryResponse
	g.Expect(codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(all)}, &resp)).To(Succeed())
	g.Expect(resp.GetResources()).To(HaveLen(7))
}

package guard

import (
	"slices"
	"strconv"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// The codec writes a response's own fields itself and its resources from the shared encoding;
// a field it does not know would be lost, so a new one in go-control-plane fails here.
func TestTheCodecKnowsEveryFieldOfADiscoveryResponse(t *testing.T) {
	known := []protoreflect.FieldNumber{1, resourcesField, 3, 4, 5, 6, 7} // 7, resource_errors: encoded as gRPC does
	fields := (&discovery.DiscoveryResponse{}).ProtoReflect().Descriptor().Fields()
	var have []protoreflect.FieldNumber
	for i := range fields.Len() {
		have = append(have, fields.Get(i).Number())
	}
	slices.Sort(have)
	if !slices.Equal(have, known) {
		t.Fatalf("DiscoveryResponse's fields are %v; the codec knows %v", have, known)
	}
}

// A response of every resource a shared served holds (SotW, or delta) is its own fields,
// encoded for it, and the served's one encoding of its resources, the same buffer for every
// response; any other response is encoded whole, as gRPC's codec does. A client decodes the
// response it was given either way.
func TestTheCodecWritesWhatEveryStreamIsServedOnce(t *testing.T) {
	g := NewWithT(t)
	var items []*item
	for i := range 40 {
		name := "c" + strconv.Itoa(i)
		a, err := anypb.New(&cluster.Cluster{Name: name, LbPolicy: cluster.Cluster_LEAST_REQUEST})
		g.Expect(err).NotTo(HaveOccurred())
		items = append(items, &item{name: name, version: "1", any: a})
	}
	sv := (*served)(nil).fold(resource.ClusterType, items, "v1", nil, false)
	gd := &Guard{}
	gd.share(nil, sv)
	c := gd.Codec()
	sotw := func(nonce string, rs []*anypb.Any) proto.Message {
		return &discovery.DiscoveryResponse{VersionInfo: "v1.1", TypeUrl: resource.ClusterType, Nonce: nonce, Canary: true,
			ControlPlane: &core.ControlPlane{Identifier: "cp"}, Resources: rs}
	}
	delta := func(nonce string, rs []*discovery.Resource) proto.Message {
		return &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v1", TypeUrl: resource.ClusterType, Nonce: nonce,
			ControlPlane: &core.ControlPlane{Identifier: "cp"}, RemovedResources: []string{"gone"},
			RemovedResourceNames: []*discovery.ResourceName{{Name: "gone"}}, Resources: rs}
	}
	// encodes is what c writes of resp: decoded, it is resp; shared, its second buffer.
	encodes := func(resp proto.Message, buffers int, what string) []byte {
		b, err := c.Marshal(resp)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(b).To(HaveLen(buffers), what)
		out := resp.ProtoReflect().New().Interface()
		g.Expect(proto.Unmarshal(b.Materialize(), out)).To(Succeed())
		g.Expect(proto.Equal(out, resp)).To(BeTrue(), what)
		if buffers == 2 {
			return b[1].ReadOnlyData()
		}
		return nil
	}

	for _, shared := range [][2]proto.Message{{sotw("1", sv.anys), sotw("2", sv.anys)}, {delta("1", sv.wires), delta("2", sv.wires)}} {
		one, two := encodes(shared[0], 2, "shared"), encodes(shared[1], 2, "shared")
		g.Expect(&one[0]).To(BeIdenticalTo(&two[0]), "one encoding of the resources for both")
	}

	// Not everything served, or not the served's own slice, or a field the codec leaves to gRPC's:
	// encoded whole.
	errs := sotw("3", sv.anys).(*discovery.DiscoveryResponse)
	errs.ResourceErrors = []*discovery.ResourceError{{ErrorDetail: &rpcstatus.Status{Code: 5, Message: "c9: not found"}}}
	deltaErrs := delta("3", sv.wires).(*discovery.DeltaDiscoveryResponse)
	deltaErrs.ResourceErrors = errs.ResourceErrors
	for what, resp := range map[string]proto.Message{
		"a copy":                 sotw("3", slices.Clone(sv.anys)),
		"a part":                 sotw("3", sv.anys[:10]),
		"resource errors":        errs,
		"a delta copy":           delta("3", slices.Clone(sv.wires)),
		"a delta part":           delta("3", sv.wires[:10]),
		"delta resource errors":  deltaErrs,
		"neither SotW nor delta": &discovery.DiscoveryRequest{VersionInfo: "v1"},
	} {
		encodes(resp, 1, what)
	}

	// Once the feed serves another version, the codec no longer knows this one's.
	next := sv.fold(resource.ClusterType, items[:1], "v2", nil, false)
	gd.share(sv, next)
	encodes(sotw("4", sv.anys), 1, "an old version")
	encodes(delta("4", sv.wires), 1, "an old version")
	gd.share(next, nil)
	g.Expect(gd.shares.m).To(BeEmpty())
}

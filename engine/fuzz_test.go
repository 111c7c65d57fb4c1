package engine

import (
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine/event"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// FuzzNACK: any NACK error_detail a zone may send (bytes of a google.rpc.Status, whatever its
// details hold) is read without a panic; the rejected names are names of the response it
// answers, each once, every other name of it counts as accepted, and the text kept is bounded.
func FuzzNACK(f *testing.F) {
	list := &kdsv1.RejectionList{Kind: "MeshTimeout", Rejections: []*kdsv1.Rejection{
		{Name: "default/a", Reason: "no", Cause: kdsv1.Cause_CAUSE_MISSING_OWNER, MissingOwner: &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}},
		{Name: "not-sent", Cause: kdsv1.Cause(99)},
	}}
	a, _ := anypb.New(list)
	good, _ := proto.Marshal(&rpcstatus.Status{Code: 3, Message: "rejected", Details: []*anypb.Any{a}})
	plain, _ := proto.Marshal(&rpcstatus.Status{Code: 3, Message: "plain"})
	bogus, _ := proto.Marshal(&rpcstatus.Status{Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/kds.v1.RejectionList", Value: []byte{0xff, 0x01}}}})
	for _, b := range [][]byte{good, plain, bogus, {}, {0x0a, 0xff}} {
		f.Add(b)
	}
	answered := &inflight{kind: "MeshTimeout", resp: &discovery.DeltaDiscoveryResponse{
		Resources: []*discovery.Resource{{Name: "default/a", Version: "1"}, {Name: "default/b", Version: "2"}}}}
	sent := len(answered.resp.Resources)
	const maxText = 256
	f.Fuzz(func(t *testing.T, b []byte) {
		detail := &rpcstatus.Status{}
		if proto.Unmarshal(b, detail) != nil {
			return
		}
		n := nackOf(1, "zone-1", answered, detail, maxText, event.CauseUnspecified)
		if len(n.Detail) > maxText {
			t.Fatalf("detail of %d bytes kept", len(n.Detail))
		}
		for _, r := range n.Rejected {
			if _, ok := answered.Version(r.Name); !ok {
				t.Fatalf("rejected %q, which the response did not carry", r.Name)
			}
			if len(r.Reason) > maxText {
				t.Fatalf("reason of %d bytes kept", len(r.Reason))
			}
		}
		seen := map[string]bool{}
		for _, r := range n.Rejected {
			if seen[r.Name] {
				t.Fatalf("%q rejected twice", r.Name)
			}
			seen[r.Name] = true
		}
		if len(n.Rejected)+len(n.Accepted) != sent {
			t.Fatalf("%d rejected and %d accepted of %d sent", len(n.Rejected), len(n.Accepted), sent)
		}
	})
}

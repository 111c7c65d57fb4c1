package zone

import (
	"context"
	"encoding/json"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

func newTestClient(t *testing.T) (*Client, store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := New(Config{Zone: "zone-1", GlobalAddress: "grpc://127.0.0.1:1", Store: st, Registry: resource.Default()})
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

func meshEntry(t *testing.T, name string) *discovery.Resource {
	t.Helper()
	e, err := kds.NewEntry(&resource.Resource{Kind: "Mesh", Name: name, Spec: json.RawMessage(`{}`), Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &discovery.Resource{Name: name, Version: e.Version, Resource: e.Any}
}

// Defect 4, first half: a failed transaction that holds only removals was ACKed.
func TestAFailedRemovalIsNACKed(t *testing.T) {
	g := NewWithT(t)
	c, st := newTestClient(t)
	ctx := context.Background()
	req := c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "1", Resources: []*discovery.Resource{meshEntry(t, "default")}})
	g.Expect(req.GetErrorDetail()).To(BeNil(), "stored")

	st.Close() // every transaction fails from now on
	req = c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "2", RemovedResources: []string{"default"}})
	g.Expect(req.GetErrorDetail()).NotTo(BeNil(), "a removal the database refused is a NACK")
	list := kds.RejectionListOf(req.GetErrorDetail())
	g.Expect(list.GetRejections()).To(HaveLen(1))
	g.Expect(list.GetRejections()[0].GetName()).To(Equal("default"))
	g.Expect(list.GetRejections()[0].GetReason()).To(ContainSubstring("removal failed"))
	g.Expect(c.Stats().NACKs).To(Equal(int64(1)))
}

// Defect 4, second half: a rejection list that failed to encode turned the NACK into an ACK.
func TestARejectionThatCannotBeEncodedAsIsStillANACK(t *testing.T) {
	g := NewWithT(t)
	c, _ := newTestClient(t)
	bad := meshEntry(t, "default")
	bad.Name = "de\xfffault" // not UTF-8: a protobuf string cannot hold it as it is
	req := c.apply(context.Background(), &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "1", Resources: []*discovery.Resource{bad}})
	g.Expect(req.GetErrorDetail()).NotTo(BeNil())
	list := kds.RejectionListOf(req.GetErrorDetail())
	g.Expect(list.GetRejections()).To(HaveLen(1))
	g.Expect(list.GetRejections()[0].GetName()).To(Equal("de\ufffdfault"))
}

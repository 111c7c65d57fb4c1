package zone

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine/nack"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
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
	req := c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "1", Resources: []*discovery.Resource{meshEntry(t, "default")}}).reply
	g.Expect(req.GetErrorDetail()).To(BeNil(), "stored")

	st.Close() // every transaction fails from now on
	req = c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "2", RemovedResources: []string{"default"}}).reply
	g.Expect(req.GetErrorDetail()).NotTo(BeNil(), "a removal the database refused is a NACK")
	list := nack.RejectionListOf(req.GetErrorDetail())
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
	req := c.apply(context.Background(), &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "1", Resources: []*discovery.Resource{bad}}).reply
	g.Expect(req.GetErrorDetail()).NotTo(BeNil())
	list := nack.RejectionListOf(req.GetErrorDetail())
	g.Expect(list.GetRejections()).To(HaveLen(1))
	g.Expect(list.GetRejections()[0].GetName()).To(Equal("de\ufffdfault"))
}

// Which cause clears which names: the zone's memory of what it refused.
func TestRefusalsSayWhatToAskForAgain(t *testing.T) {
	g := NewWithT(t)
	r := newRefusals()
	mesh := &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}
	r.refused("Mesh", []*kdsv1.Rejection{{Name: "default", Cause: kdsv1.Cause_CAUSE_TRANSIENT}, {Name: "other", Cause: kdsv1.Cause_CAUSE_INVALID}})
	r.refused("MeshTimeout", []*kdsv1.Rejection{
		{Name: "default/a", Cause: kdsv1.Cause_CAUSE_MISSING_OWNER, MissingOwner: mesh},
		{Name: "default/b", Cause: kdsv1.Cause_CAUSE_MISSING_OWNER, MissingOwner: mesh},
		{Name: "default/c", Cause: kdsv1.Cause_CAUSE_TRANSIENT},
		{Name: "prod/x", Cause: kdsv1.Cause_CAUSE_MISSING_OWNER, MissingOwner: &kdsv1.ResourceKey{Kind: "Mesh", Name: "prod"}},
	})
	r.refused("MeshRetry", []*kdsv1.Rejection{{Name: "default/r", Cause: kdsv1.Cause_CAUSE_MISSING_OWNER, MissingOwner: mesh}})
	r.settled("MeshRetry", []string{"default/r"}) // stored after all, by a later response

	g.Expect(r.admissionReady("Mesh")).To(Equal([]string{"default"}), "only TRANSIENT; INVALID is never asked for again")
	g.Expect(r.admissionReady("Mesh")).To(BeEmpty(), "asked once")
	g.Expect(r.admissionReady("MeshTimeout")).To(Equal([]string{"default/c"}))
	g.Expect(r.ownersStored(nil)).To(BeEmpty())
	g.Expect(r.ownersStored([]resource.Key{{Kind: "Mesh", Name: "default"}})).To(Equal(map[string][]string{"MeshTimeout": {"default/a", "default/b"}}))
	g.Expect(r.ownersStored([]resource.Key{{Kind: "Mesh", Name: "default"}})).To(BeEmpty(), "asked once")
	g.Expect(r.ownersStored([]resource.Key{{Kind: "Mesh", Name: "prod"}})).To(Equal(map[string][]string{"MeshTimeout": {"prod/x"}}))
	g.Expect(r.byKind).To(HaveKey("Mesh"), "the INVALID name is still remembered")
	g.Expect(r.byKind).NotTo(HaveKey("MeshTimeout"))
}

func TestTheZoneGivesEachRefusalItsCause(t *testing.T) {
	g := NewWithT(t)
	st, err := store.Open(context.Background(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	defer st.Close()
	c, err := New(Config{Zone: "zone-1", GlobalAddress: "grpc://127.0.0.1:1", Store: st, Registry: resource.Default(),
		AdmissionOutage: map[string]time.Duration{"MeshRetry": time.Hour}, AdmissionDeny: map[string]string{"deny": "yes"}})
	g.Expect(err).NotTo(HaveOccurred())
	entry := func(r resource.Resource) *discovery.Resource {
		e, err := kds.NewEntry(&r)
		g.Expect(err).NotTo(HaveOccurred())
		return &discovery.Resource{Name: r.Key().XDSName(), Version: e.Version, Resource: e.Any}
	}
	causes := func(out applied) map[string]kdsv1.Cause {
		m := map[string]kdsv1.Cause{}
		for _, rj := range nack.RejectionListOf(out.reply.GetErrorDetail()).GetRejections() {
			m[rj.GetName()] = rj.GetCause()
		}
		return m
	}
	ctx := context.Background()
	out := c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "1", Resources: []*discovery.Resource{
		entry(resource.Resource{Kind: "MeshTimeout", Mesh: "default", Name: "orphan", Spec: json.RawMessage(`{}`)}),
	}})
	g.Expect(causes(out)).To(Equal(map[string]kdsv1.Cause{"default/orphan": kdsv1.Cause_CAUSE_MISSING_OWNER}))
	g.Expect(nack.RejectionListOf(out.reply.GetErrorDetail()).GetRejections()[0].GetMissingOwner().GetName()).To(Equal("default"))

	out = c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "2", Resources: []*discovery.Resource{
		entry(resource.Resource{Kind: "Mesh", Name: "default", Spec: json.RawMessage(`{}`)}),
		entry(resource.Resource{Kind: "Mesh", Name: "denied", Labels: map[string]string{"deny": "yes"}, Spec: json.RawMessage(`{}`)}),
	}})
	g.Expect(causes(out)).To(Equal(map[string]kdsv1.Cause{"denied": kdsv1.Cause_CAUSE_INVALID}))
	g.Expect(out.stored).To(Equal([]resource.Key{{Kind: "Mesh", Name: "default"}}))

	out = c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshRetry", Nonce: "3", Resources: []*discovery.Resource{
		entry(resource.Resource{Kind: "MeshRetry", Mesh: "default", Name: "r", Spec: json.RawMessage(`{}`)}),
	}})
	g.Expect(causes(out)).To(Equal(map[string]kdsv1.Cause{"default/r": kdsv1.Cause_CAUSE_TRANSIENT}))

	// A plain xDS client says why in words only.
	c.cfg.Plain = true
	out = c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshRetry", Nonce: "4", Resources: []*discovery.Resource{
		entry(resource.Resource{Kind: "MeshRetry", Mesh: "default", Name: "r", Spec: json.RawMessage(`{}`)}),
	}})
	g.Expect(out.reply.GetErrorDetail().GetMessage()).To(ContainSubstring("admission webhook for MeshRetry is not ready"))
	g.Expect(nack.RejectionListOf(out.reply.GetErrorDetail())).To(BeNil())
}

// FuzzDecode: any resource a global may send (the bytes inside its Any, under any name) is
// stored as a valid resource of its kind and name, or refused with a reason; never a panic.
func FuzzDecode(f *testing.F) {
	good, _ := kds.NewEntry(&resource.Resource{Kind: "MeshTimeout", Mesh: "default", Name: "t",
		Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"3s"}}`)})
	f.Add(good.Any.GetValue(), "default/t", "MeshTimeout")
	f.Add(good.Any.GetValue(), "other/t", "MeshTimeout")
	f.Add([]byte{0x0a, 0x04, 'M', 'e', 's', 'h'}, "x", "Mesh")
	f.Add([]byte{0xff}, "", "Nope")
	c := &Client{cfg: Config{Registry: resource.Default()}}
	f.Fuzz(func(t *testing.T, value []byte, name, kind string) {
		r, err := c.decode(kind, &discovery.Resource{Name: name, Resource: &anypb.Any{TypeUrl: kind, Value: value}})
		if err != nil {
			if err.Error() == "" {
				t.Fatal("a refusal without a reason")
			}
			return
		}
		if r.Kind != kind || r.Key().XDSName() != name {
			t.Fatalf("stored %s as %s %q", r.Key(), kind, name)
		}
		if err := resource.Default().Validate(&r); err != nil {
			t.Fatalf("stored an invalid %s: %v", r.Key(), err)
		}
	})
}

func TestGlobalAddressesAreAListOfReplicas(t *testing.T) {
	g := NewWithT(t)
	addrs, err := ParseAddresses(" grpc://10.0.0.1:5685, grpcs://10.0.0.2:5685 ,,grpc://[::1]:5685")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(addrs).To(Equal([]string{"grpc://10.0.0.1:5685", "grpcs://10.0.0.2:5685", "grpc://[::1]:5685"}))
	_, err = ParseAddresses("grpc://10.0.0.1:5685,http://10.0.0.2:5685")
	g.Expect(err).To(MatchError(ContainSubstring(`scheme "http"`)))

	st, err := store.Open(context.Background(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	defer st.Close()
	newClient := func(cfg Config) (*Client, error) {
		cfg.Zone, cfg.Store, cfg.Registry = "zone-1", st, resource.Default()
		return New(cfg)
	}
	c, err := newClient(Config{GlobalAddress: "grpc://10.0.0.1:5685,grpc://10.0.0.2:5685", GlobalAddresses: []string{"grpcs://10.0.0.3:5685"}})
	g.Expect(err).NotTo(HaveOccurred())
	var got []string
	for _, ep := range c.endpoints(context.Background()) {
		got = append(got, ep.String())
	}
	g.Expect(got).To(Equal([]string{"grpc://10.0.0.1:5685", "grpc://10.0.0.2:5685", "grpcs://10.0.0.3:5685"}), "in the order given")

	// A host name stands for every address it resolves to; one that does not resolve is kept,
	// to fail when dialled.
	ips, _ := net.LookupHost("localhost")
	c, err = newClient(Config{GlobalAddress: "grpc://localhost:5685,grpc://no-such-host.invalid:5685"})
	g.Expect(err).NotTo(HaveOccurred())
	eps := c.endpoints(context.Background())
	g.Expect(eps).To(HaveLen(max(len(ips), 1) + 1))
	g.Expect(eps[len(eps)-1].String()).To(Equal("grpc://no-such-host.invalid:5685"))
	if len(ips) > 1 {
		g.Expect(eps[0].ip).To(Equal(net.JoinHostPort(ips[0], "5685")))
		g.Expect(eps[0].target).To(Equal("localhost:5685"), "TLS checks the name, not the address")
	}

	_, err = newClient(Config{GlobalAddress: " , "})
	g.Expect(err).To(MatchError(ContainSubstring("address is required")))
}

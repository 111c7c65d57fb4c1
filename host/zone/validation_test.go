package zone

import (
	"context"
	"encoding/json"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine/nack"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// A spec the global let through (an older global, or one with other schemas) is checked again
// by the zone with the same Registry.Validate: refused as INVALID, naming the field, not stored.
func TestTheZoneNACKsAnInvalidSpecAsInvalid(t *testing.T) {
	g := NewWithT(t)
	c, st := newTestClient(t)
	ctx := context.Background()
	g.Expect(c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "Mesh", Nonce: "1",
		Resources: []*discovery.Resource{meshEntry(t, "default")}}).reply.GetErrorDetail()).To(BeNil())

	entry := func(name, spec string) *discovery.Resource {
		// kds.NewEntry does not validate: this is what a global without the schemas sends.
		r := resource.Resource{Kind: "MeshTimeout", Mesh: "default", Name: name, Spec: json.RawMessage(spec), Generation: 1}
		e, err := kds.NewEntry(&r)
		g.Expect(err).NotTo(HaveOccurred())
		return &discovery.Resource{Name: r.Key().XDSName(), Version: e.Version, Resource: e.Any}
	}
	bad := []struct{ name, spec, reason string }{
		{"unknown-field", `{"targetRef":{"kind":"Mesh"},"default":{"bogus":"1s"}}`, "spec.default.bogus: unknown field"},
		{"unknown-kind", `{"targetRef":{"kind":"Nope"},"default":{"idleTimeout":"1s"}}`, `spec.targetRef.kind: unknown kind "Nope"`},
		{"no-default", `{"to":[{"targetRef":{"kind":"Mesh"}}]}`, "spec.to[0].default: is required"},
	}
	reason := map[string]string{}
	resources := []*discovery.Resource{entry("good", `{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}`)}
	for _, b := range bad {
		resources = append(resources, entry(b.name, b.spec))
		reason["default/"+b.name] = b.reason
	}
	out := c.apply(ctx, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "2", Resources: resources})

	g.Expect(out.reply.GetErrorDetail()).NotTo(BeNil(), "a NACK")
	rejections := nack.RejectionListOf(out.reply.GetErrorDetail()).GetRejections()
	g.Expect(rejections).To(HaveLen(len(bad)))
	for _, rj := range rejections {
		g.Expect(rj.GetCause()).To(Equal(kdsv1.Cause_CAUSE_INVALID), rj.GetName())
		g.Expect(rj.GetReason()).To(ContainSubstring(reason[rj.GetName()]), rj.GetName())
	}
	g.Expect(out.stored).To(ConsistOf(resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "good"}))
	acked, err := st.List(ctx, "MeshTimeout", "default")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(acked).To(HaveLen(1))
	g.Expect(acked[0].Name).To(Equal("good"))
}

package resource_test

import (
	"encoding/json"
	"errors"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

func TestPlurals(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	var plurals []string
	for _, k := range reg.Kinds() {
		plurals = append(plurals, k.Plural)
	}
	g.Expect(plurals).To(Equal([]string{"meshes", "meshtimeouts", "meshretries", "meshcircuitbreakers",
		"meshhealthchecks", "meshratelimits", "meshtrafficpermissions", "meshaccesslogs", "meshfaultinjections"}))
	for _, s := range []string{"MeshRetry", "meshretry", "meshretries", "MESHRETRIES"} {
		k, ok := reg.Lookup(s)
		g.Expect(ok).To(BeTrue(), s)
		g.Expect(k.Name).To(Equal("MeshRetry"))
	}
}

func TestValidate(t *testing.T) {
	reg := resource.Default()
	for _, tc := range []struct {
		name  string
		r     resource.Resource
		field string
	}{
		{"unknown kind", resource.Resource{Kind: "Nope", Name: "a"}, "type"},
		{"bad name", resource.Resource{Kind: "Mesh", Name: "Bad_Name"}, "name"},
		{"mesh on a global kind", resource.Resource{Kind: "Mesh", Name: "a", Mesh: "x"}, "mesh"},
		{"policy without mesh", resource.Resource{Kind: "MeshTimeout", Name: "a"}, "mesh"},
		{"spec not an object", resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`[1]`)}, "spec"},
		{"bad duration", resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{"default":{"connectionTimeout":"abc"}}`)}, "spec.default.connectionTimeout"},
		{"unknown owner kind", resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Owners: []resource.Key{{Kind: "X", Name: "b"}}}, "owners[0].kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := reg.Validate(&tc.r)
			var ve *resource.ValidationError
			g.Expect(errors.As(err, &ve)).To(BeTrue(), "%v", err)
			g.Expect(ve.Field).To(Equal(tc.field))
		})
	}
	g := NewWithT(t)
	ok := resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{ "default": {"connectionTimeout": "5s"} }`)}
	g.Expect(reg.Validate(&ok)).To(Succeed())
	g.Expect(string(ok.Spec)).To(Equal(`{"default":{"connectionTimeout":"5s"}}`))
	for _, d := range resource.MeshDefaults("default") {
		g.Expect(reg.Validate(&d)).To(Succeed(), d.Name)
	}
}

func TestVersionSurvivesTheWire(t *testing.T) {
	g := NewWithT(t)
	r := resource.Resource{Kind: "MeshTimeout", Mesh: "m", Name: "a", Labels: map[string]string{"x": "y"},
		Spec: json.RawMessage(`{"n":1024,"f":1.5,"s":"5s","l":[1,"a",true,null]}`), Generation: 3}
	p, err := r.ToProto()
	g.Expect(err).NotTo(HaveOccurred())
	back, err := resource.FromProto(p)
	g.Expect(err).NotTo(HaveOccurred())
	back.Generation = 7
	p2, err := back.ToProto()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resource.Version(p2)).To(Equal(resource.Version(p)), "equal content, equal version, whatever the generation")
	r.Spec = json.RawMessage(`{"n":1025}`)
	p3, _ := r.ToProto()
	g.Expect(resource.Version(p3)).NotTo(Equal(resource.Version(p)))
}

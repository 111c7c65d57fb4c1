package api_test

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
)

func TestSplitDocuments(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string
	}{
		{"nothing", "", nil},
		{"blank and comments only", "\n# c\n---\n  \n---\n", nil},
		{"one bare document", "a: 1\nb: 2", []string{"a: 1\nb: 2"}},
		{"leading marker", "---\na: 1\n", []string{"a: 1\n"}},
		{"several, empty ones dropped", "a: 1\n---\n---\n# only a comment\n---\nb: 2\n", []string{"a: 1\n", "b: 2\n"}},
		{"content after the marker", "--- {a: 1}\n--- # c\nb: 2\n", []string{" {a: 1}\n", "b: 2\n"}},
		{"document end marker", "a: 1\n...\n---\nb: 2\n", []string{"a: 1\n", "b: 2\n"}},
		{"CRLF", "a: 1\r\n---\r\nb: 2\r\n", []string{"a: 1\r\n", "b: 2\r\n"}},
		{"a marker needs a space", "a: ---x\n---x: 1\n", []string{"a: ---x\n---x: 1\n"}},
		{"indented dashes are content", "s: |\n  ---\n  x\n", []string{"s: |\n  ---\n  x\n"}},
		{"directives", "%YAML 1.2\n---\na: 1\n", []string{"a: 1\n"}},
		{"byte order mark", "\xef\xbb\xbfa: 1\n", []string{"a: 1\n"}},
		{"JSON", `{"a": 1}`, []string{`{"a": 1}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			var got []string
			for _, d := range api.SplitDocuments([]byte(tc.in)) {
				got = append(got, string(d))
			}
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

func TestDecodeResource(t *testing.T) {
	g := NewWithT(t)
	r, err := api.DecodeResource([]byte("type: MeshTimeout\nmesh: default\nname: x\nlabels: {a: b}\nowners: [{kind: Mesh, name: default}]\nspec: {k: v}\ngeneration: 3\n"))
	g.Expect(err).To(BeNil())
	g.Expect(r).To(Equal(resource.Resource{
		Kind: "MeshTimeout", Mesh: "default", Name: "x", Labels: map[string]string{"a": "b"},
		Owners: []resource.Key{{Kind: "Mesh", Name: "default"}}, Spec: []byte(`{"k":"v"}`), Generation: 3,
	}))

	for _, doc := range []string{`{"name":"x"} {"name":"y"}`, "{\"name\":\"x\"}\n{\"name\":\"y\"}\n", `{"name":"x"}}`, "{name: x} junk"} {
		_, err = api.DecodeResource([]byte(doc))
		g.Expect(err).NotTo(BeNil(), doc)
		g.Expect(err.Details).To(ContainSubstring("body: is not valid YAML or JSON: content after the document"), doc)
	}
}

func TestPath(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	mesh, _ := reg.Get("Mesh")
	mt, _ := reg.Get("MeshTimeout")
	g.Expect(api.Path(mesh, "", "")).To(Equal("/meshes"))
	g.Expect(api.Path(mesh, "", "default")).To(Equal("/meshes/default"))
	g.Expect(api.Path(mt, "default", "")).To(Equal("/meshes/default/meshtimeouts"))
	g.Expect(api.Path(mt, "default", "t")).To(Equal("/meshes/default/meshtimeouts/t"))
	g.Expect(api.Path(mt, "", "")).To(Equal("/meshtimeouts"))
}

package api_test

import (
	"testing"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
)

// FuzzDocuments: any API body, YAML or JSON, one document or many, is split, decoded and
// validated without a panic; what decodes has a kind and a name, or is refused.
func FuzzDocuments(f *testing.F) {
	for _, s := range []string{
		"type: Mesh\nname: default\n",
		"---\ntype: MeshTimeout\nmesh: default\nname: t\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 3s}\n---\n",
		`{"type":"Mesh","name":"default","labels":{"a":"b"}}`,
		"type: [\n", "{", "---\n---\n", "type: MeshTimeout\nspec: 3\n", "\xff\xfe", "name: &a [*a, *a]\n",
	} {
		f.Add([]byte(s))
	}
	reg := resource.Default()
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, doc := range api.SplitDocuments(body) {
			r, apiErr := api.DecodeResource(doc)
			if apiErr != nil {
				if apiErr.Details == "" && apiErr.Title == "" {
					t.Fatalf("an error that says nothing for %q", doc)
				}
				continue
			}
			_ = reg.Validate(&r)
		}
	})
}

package api_test

import (
	"strings"
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
		// Aliases: expanded past the limit, of aliases, merged, nested past the depth limit.
		aliasBomb(8, 1<<20),
		"a: &a [x,x,x,x]\nb: &b [*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b]\nspec: [*c,*c,*c,*c]\n",
		"type: Mesh\nname: m\nbase: &b {k: v}\nspec: {<<: *b, l: w}\n",
		"spec:\n  a: &a " + strings.Repeat("[", 60) + strings.Repeat("]", 60) + "\n  b: " + strings.Repeat("[", 50) + "*a" + strings.Repeat("]", 50) + "\n",
		// Nesting: at the limit and past it, in JSON and in YAML.
		nested(api.MaxNestingDepth - 1), nested(api.MaxNestingDepth), nested(20000),
		"spec: " + strings.Repeat("{a: ", 120) + "1" + strings.Repeat("}", 120) + "\n",
		`{"spec":"[[[[{{{{\\"[["}`,
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

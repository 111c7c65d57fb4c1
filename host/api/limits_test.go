package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
)

// aliasBomb is a YAML resource of n aliases of one item of size bytes: about n*size bytes once
// its aliases are expanded.
func aliasBomb(n, size int) string {
	return "type: Mesh\nname: bomb\nspec:\n  item: &x \"" + strings.Repeat("a", size) + "\"\n  copies: [" +
		strings.TrimSuffix(strings.Repeat("*x, ", n), ", ") + "]\n"
}

// nested is a JSON resource whose spec holds depth levels of objects, the resource's own
// object not counted.
func nested(depth int) string {
	return `{"type":"Mesh","name":"deep","spec":` + strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) + "}"
}

// Decoding is bounded by what the document says, not what it expands to: YAML aliases that
// expand a document past the body limit are refused with 413 before they are expanded (before: a
// 1 MB body of 200 aliases of a 1 MB item was built into 210 MB, +1.7 GB of memory, and refused
// by validation after 9 s), and objects and lists nest at most api.MaxNestingDepth levels, in
// JSON and YAML, aliases counted (400).
func TestDecodingIsBoundedBeforeAnythingIsBuilt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		doc    string
		status int // 0: decoded
		says   string
	}{
		{"200 aliases of a 1 MB item", aliasBomb(200, 1<<20), http.StatusRequestEntityTooLarge,
			"its YAML aliases expand it past the size limit: about 2"},
		{"aliases within the limit", aliasBomb(2, 1<<20), 0, ""},
		{"aliases of aliases (a billion laughs)", "type: Mesh\nname: lol\nspec:\n  a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n" +
			"  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n" +
			"  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n" +
			"  h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n  i: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n", http.StatusRequestEntityTooLarge, "aliases expand it"},
		{"an alias of itself", "type: Mesh\nname: x\nspec: &a {b: [*a]}\n", http.StatusBadRequest, "anchor &a holds an alias of itself"},
		{"JSON at the depth limit", nested(api.MaxNestingDepth - 1), 0, ""},
		{"JSON past the depth limit", nested(api.MaxNestingDepth), http.StatusBadRequest,
			fmt.Sprintf("body: nests too deep: more than %d levels of objects and lists (at byte ", api.MaxNestingDepth)},
		{"JSON far past the limit of the JSON decoder", nested(20000), http.StatusBadRequest, "nests too deep"},
		{"YAML past the depth limit", "type: Mesh\nname: deep\nspec: " + strings.Repeat("[", 120) + strings.Repeat("]", 120) + "\n",
			http.StatusBadRequest, "(line 3, column "},
		{"YAML past the depth limit by its aliases", "type: Mesh\nname: deep\nspec:\n  a: &a " + strings.Repeat("[", 60) + strings.Repeat("]", 60) +
			"\n  b: " + strings.Repeat("[", 50) + "*a" + strings.Repeat("]", 50) + "\n", http.StatusBadRequest, "an alias of &a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			_, apiErr := api.DecodeResource([]byte(tc.doc))
			if tc.status == 0 {
				g.Expect(apiErr).To(BeNil())
				return
			}
			g.Expect(apiErr).NotTo(BeNil())
			g.Expect(apiErr.Status).To(Equal(tc.status), apiErr.Error())
			g.Expect(apiErr.Details).To(ContainSubstring(tc.says))
		})
	}
}

// The CLI's reading of a file (api.DocumentJSON) holds the same bounds; a document that lists
// resources may nest two levels more for its list.
func TestDocumentJSONIsBoundedAsTheBody(t *testing.T) {
	g := NewWithT(t)
	_, err := api.DocumentJSON([]byte(aliasBomb(200, 1<<20)))
	g.Expect(err).To(MatchError(api.ErrExpandsTooLarge))
	list := `{"items":[` + nested(api.MaxNestingDepth-1) + `]}`
	_, err = api.DocumentJSON([]byte(list))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = api.DocumentJSON([]byte(`{"items":[` + nested(api.MaxNestingDepth+1) + `]}`))
	g.Expect(err).To(MatchError(api.ErrNestsTooDeep))
}

// Every item of a batch says its place, its name as far as it could be read, and the status a
// PUT of it alone would have got (before: an item over 4 MiB had key "/" and no status); a batch
// of too many items is 413 saying so (before: titled "Resource is not valid").
func TestABatchAnswersEachItemsStatusAndName(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore()})
	c.mustPut("/meshes/default", "{}")
	big := `{"type":"MeshTimeout","mesh":"default","name":"big","spec":{"pad":"` + strings.Repeat("a", api.MaxBodyBytes) + `"}}`
	a := c.do(http.MethodPost, "/api/apply", `{"items":[`+strings.Join([]string{
		`{"type":"Mesh","name":"new"}`,
		`{"type":"Mesh","name":"default"}`,
		big,
		`{"type":"MeshTimeout","mesh":"default","name":"bad","spec":{"default":{"connectionTimeout":"abc"}}}`,
		`{"type":"MeshTimeout","mesh":"nope","name":"orphan","spec":{"default":{"idleTimeout":"1s"}}}`,
		`{"spec":{}}`,
		`{"type":"Mesh","name":7}`,
		nested(api.MaxNestingDepth + 5),
	}, ",")+`]}`)
	g.Expect(a.status).To(Equal(http.StatusOK), string(a.body))
	var resp api.BatchResponse
	g.Expect(json.Unmarshal(a.body, &resp)).To(Succeed())
	type item struct {
		Index  int
		Key    string
		Status int
	}
	var got []item
	for _, it := range resp.Items {
		got = append(got, item{it.Index, it.Key, it.Status})
	}
	g.Expect(got).To(Equal([]item{
		{0, "Mesh/new", http.StatusCreated},
		{1, "Mesh/default", http.StatusOK},
		{2, "MeshTimeout/default/big", http.StatusRequestEntityTooLarge},
		{3, "MeshTimeout/default/bad", http.StatusBadRequest},
		{4, "MeshTimeout/nope/orphan", http.StatusBadRequest},
		{5, "", http.StatusBadRequest},
		{6, "Mesh/", http.StatusBadRequest},
		{7, "Mesh/deep", http.StatusBadRequest},
	}))
	g.Expect(resp.Applied).To(Equal(2))
	g.Expect(resp.Failed).To(Equal(6))

	items := strings.TrimSuffix(strings.Repeat(`{"type":"Mesh","name":"m"},`, api.MaxBatch+1), ",")
	a = c.do(http.MethodPost, "/api/apply", `{"items":[`+items+`]}`)
	g.Expect(a.status).To(Equal(http.StatusRequestEntityTooLarge))
	g.Expect(a.err().Title).To(Equal("Batch too large"))
	g.Expect(a.err().Details).To(Equal(fmt.Sprintf("items: %d resources in one batch; at most %d: split it (kds-host apply does)", api.MaxBatch+1, api.MaxBatch)))
}

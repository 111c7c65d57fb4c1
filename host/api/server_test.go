package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// backends runs a test against the in-memory test double and a real SQLite store.
func backends(t *testing.T, test func(t *testing.T, st store.Store)) {
	t.Run("memory", func(t *testing.T) { test(t, newMemStore()) })
	t.Run("sqlite", func(t *testing.T) {
		st, err := store.Open(context.Background(), "", t.TempDir())
		if err != nil {
			t.Fatalf("open SQLite store: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
		test(t, st)
	})
}

// apiClient is an httptest server over a Server, and a few helpers to call it.
type apiClient struct {
	t   *testing.T
	g   *WithT
	url string
	srv *api.Server
}

func newAPI(t *testing.T, cfg api.Config) *apiClient {
	t.Helper()
	s := api.New(cfg)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return &apiClient{t: t, g: NewWithT(t), url: ts.URL, srv: s}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json() map[string]any {
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		panic("answer is not a JSON object: " + string(a.body))
	}
	return m
}

func (a answer) err() api.Error {
	var e api.Error
	if err := json.Unmarshal(a.body, &e); err != nil {
		panic("answer is not an error: " + string(a.body))
	}
	return e
}

func (a answer) list() api.List {
	var l api.List
	if err := json.Unmarshal(a.body, &l); err != nil {
		panic("answer is not a list: " + string(a.body))
	}
	return l
}

func (c *apiClient) do(method, path, body string) answer {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.url+path, rd)
	c.g.Expect(err).NotTo(HaveOccurred())
	resp, err := http.DefaultClient.Do(req)
	c.g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	c.g.Expect(err).NotTo(HaveOccurred())
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func (c *apiClient) mustPut(path, body string) answer {
	c.t.Helper()
	a := c.do(http.MethodPut, path, body)
	c.g.Expect(a.status).To(BeNumerically("<", 300), "PUT %s: %s", path, a.body)
	return a
}

func (c *apiClient) total(path string) int {
	c.t.Helper()
	a := c.do(http.MethodGet, path, "")
	c.g.Expect(a.status).To(Equal(http.StatusOK), "GET %s: %s", path, a.body)
	return a.list().Total
}

// plural is a kind's path segment in the default registry.
func plural(kind string) string {
	k, ok := resource.Default().Get(kind)
	if !ok {
		panic("no kind " + kind)
	}
	return k.Plural
}

const meshTimeoutYAML = `
type: MeshTimeout
mesh: default
name: mt-1
labels:
  team: payments
spec:
  targetRef:
    kind: Mesh
  to:
    - targetRef:
        kind: Mesh
      default:
        connectionTimeout: 3s
`

func TestCreatingAMeshCreatesItsDefaults(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: st})

		a := c.do(http.MethodPut, "/meshes/default", "type: Mesh\nname: default\n")
		g.Expect(a.status).To(Equal(http.StatusCreated), string(a.body))
		g.Expect(a.header.Get(api.ResultHeader)).To(Equal("created"))
		g.Expect(a.json()).To(HaveKeyWithValue("generation", BeEquivalentTo(1)))

		mts := c.do(http.MethodGet, "/meshes/default/meshtimeouts", "").list()
		g.Expect(mts.Total).To(Equal(2))
		g.Expect(mts.Items).To(ConsistOf(
			HaveField("Name", "mesh-timeout-all-default"),
			HaveField("Name", "mesh-gateways-timeout-all-default"),
		))
		g.Expect(c.total("/meshes/default/" + plural("MeshRetry"))).To(Equal(1))
		g.Expect(c.total("/meshes/default/meshcircuitbreakers")).To(Equal(1))

		// Only creating the mesh makes defaults: a deleted default stays deleted on reapply.
		g.Expect(c.do(http.MethodDelete, "/meshes/default/"+plural("MeshRetry")+"/mesh-retry-all-default", "").status).To(Equal(http.StatusOK))
		a = c.do(http.MethodPut, "/meshes/default", `{"type":"Mesh","name":"default"}`)
		g.Expect(a.status).To(Equal(http.StatusOK), string(a.body))
		g.Expect(a.header.Get(api.ResultHeader)).To(Equal("unchanged"))
		g.Expect(c.total("/meshes/default/" + plural("MeshRetry"))).To(Equal(0))
	})
}

func TestMeshDefaultsThatExistAreKept(t *testing.T) {
	g := NewWithT(t)
	st := newMemStore()
	ctx := t.Context()
	// A mesh that was deleted and whose default came back some other way (e.g. a replica).
	_, _, err := st.Put(ctx, resource.Resource{Kind: "Mesh", Name: "m", Spec: []byte("{}")})
	g.Expect(err).NotTo(HaveOccurred())
	custom := resource.Resource{Kind: "MeshRetry", Mesh: "m", Name: "mesh-retry-all-default", Spec: []byte(`{"custom":true}`)}
	_, _, err = st.Put(ctx, custom)
	g.Expect(err).NotTo(HaveOccurred())
	st.mu.Lock()
	delete(st.m, resource.Key{Kind: "Mesh", Name: "m"})
	st.mu.Unlock()

	c := newAPI(t, api.Config{Store: st})
	c.mustPut("/meshes/m", "{}")
	got, err := st.Get(ctx, custom.Key())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(got.Spec)).To(Equal(`{"custom":true}`))
	g.Expect(c.total("/meshes/m/meshtimeouts")).To(Equal(2))
}

func TestPolicyLifecycle(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: st})
		c.mustPut("/meshes/default", "name: default")

		a := c.do(http.MethodPut, "/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)
		g.Expect(a.status).To(Equal(http.StatusCreated), string(a.body))
		g.Expect(a.header.Get(api.ResultHeader)).To(Equal("created"))
		g.Expect(a.json()).To(And(
			HaveKeyWithValue("type", "MeshTimeout"),
			HaveKeyWithValue("mesh", "default"),
			HaveKeyWithValue("name", "mt-1"),
			HaveKeyWithValue("labels", HaveKeyWithValue("team", "payments")),
			HaveKeyWithValue("generation", BeEquivalentTo(1)),
			HaveKeyWithValue("spec", HaveKey("to")),
		))

		got := c.do(http.MethodGet, "/meshes/default/meshtimeouts/mt-1", "")
		g.Expect(got.status).To(Equal(http.StatusOK))
		g.Expect(got.json()).To(Equal(a.json()))

		// The same content again changes nothing.
		a = c.do(http.MethodPut, "/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)
		g.Expect(a.status).To(Equal(http.StatusOK))
		g.Expect(a.header.Get(api.ResultHeader)).To(Equal("unchanged"))
		g.Expect(a.json()).To(HaveKeyWithValue("generation", BeEquivalentTo(1)))

		// Kind, mesh and name come from the path when the body leaves them out.
		a = c.do(http.MethodPut, "/meshes/default/meshtimeouts/mt-1", `{"spec":{"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"4s"}}]}}`)
		g.Expect(a.status).To(Equal(http.StatusOK), string(a.body))
		g.Expect(a.header.Get(api.ResultHeader)).To(Equal("updated"))
		g.Expect(a.json()).To(HaveKeyWithValue("generation", BeEquivalentTo(2)))

		g.Expect(c.do(http.MethodDelete, "/meshes/default/meshtimeouts/mt-1", "").status).To(Equal(http.StatusOK))
		a = c.do(http.MethodGet, "/meshes/default/meshtimeouts/mt-1", "")
		g.Expect(a.status).To(Equal(http.StatusNotFound))
		g.Expect(a.err().Details).To(Equal(`MeshTimeout "mt-1" not found in mesh "default"`))
		g.Expect(c.do(http.MethodDelete, "/meshes/default/meshtimeouts/mt-1", "").status).To(Equal(http.StatusNotFound))
	})
}

func TestListShape(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: st})

		empty := c.do(http.MethodGet, "/meshes", "")
		g.Expect(empty.status).To(Equal(http.StatusOK))
		g.Expect(empty.body).To(MatchJSON(`{"items":[],"total":0}`))

		c.mustPut("/meshes/default", "{}")
		c.mustPut("/meshes/other", "{}")
		c.mustPut("/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)

		meshes := c.do(http.MethodGet, "/meshes", "").json()
		g.Expect(meshes).To(HaveLen(2))
		g.Expect(meshes).To(HaveKeyWithValue("total", BeEquivalentTo(2)))
		g.Expect(meshes["items"]).To(ConsistOf(
			And(HaveKeyWithValue("type", "Mesh"), HaveKeyWithValue("name", "default"), HaveKeyWithValue("generation", BeEquivalentTo(1)), Not(HaveKey("mesh"))),
			And(HaveKeyWithValue("type", "Mesh"), HaveKeyWithValue("name", "other")),
		))

		g.Expect(c.total("/meshes/default/meshtimeouts")).To(Equal(3))
		g.Expect(c.total("/meshes/other/meshtimeouts")).To(Equal(2))
		// A mesh-scoped kind listed outside /meshes/{mesh} spans every mesh, as in Kuma.
		g.Expect(c.total("/meshtimeouts")).To(Equal(5))
		// Any spelling the registry knows names the kind.
		g.Expect(c.total("/meshes/default/MeshTimeouts")).To(Equal(3))
	})
}

// emptyBody is an empty request body (c.do sends none for "").
const emptyBody = "\n"

func TestBadInputIsRefusedAndNothingIsStored(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		details          string
	}{
		{"bad YAML", "/meshes/default/meshtimeouts/x", "type: MeshTimeout\nspec: [unclosed\n", "body: is not valid YAML or JSON"},
		{"bad JSON", "/meshes/default/meshtimeouts/x", `{"type":"MeshTimeout",`, "body: is not valid YAML or JSON"},
		{"duplicate key", "/meshes/default/meshtimeouts/x", "name: x\nname: x\n", "body: is not valid YAML or JSON"},
		{"empty body", "/meshes/default/meshtimeouts/x", emptyBody, "body: is empty"},
		{"null", "/meshes/default/meshtimeouts/x", "null", "body: must be an object"},
		{"a list", "/meshes/default/meshtimeouts/x", "- a\n- b\n", "body: must be an object, not a JSON array"},
		{"two documents", "/meshes/default/meshtimeouts/x", "name: x\n---\nname: y\n", "body: holds 2 documents"},
		{"unknown field", "/meshes/default/meshtimeouts/x", "name: x\nspek: {}\n", "spek: unknown field"},
		{"unknown owner field", "/meshes/default/meshtimeouts/x", "owners: [{kind: Mesh, name: default, uid: 1}]\n", "uid: unknown field"},
		{"name of the wrong type", "/meshes/default/meshtimeouts/x", "name: 12\n", "name: must be a string, not a JSON number"},
		{"labels of the wrong type", "/meshes/default/meshtimeouts/x", "labels: [a]\n", "labels: must be an object of strings, not a JSON array"},
		{"bad duration", "/meshes/default/meshtimeouts/x", `{"spec":{"default":{"connectionTimeout":"abc"}}}`, `spec.default.connectionTimeout: "abc" is not a duration`},
		{"spec not an object", "/meshes/default/meshtimeouts/x", "spec: [1]\n", "spec: must be a JSON object"},
		{"type contradicts the path", "/meshes/default/meshtimeouts/x", "type: MeshRetry\n", `type: "MeshRetry" contradicts the path, which says "MeshTimeout"`},
		{"mesh contradicts the path", "/meshes/default/meshtimeouts/x", "mesh: other\n", `mesh: "other" contradicts the path, which says "default"`},
		{"name contradicts the path", "/meshes/default/meshtimeouts/x", "name: z\n", `name: "z" contradicts the path, which says "x"`},
		{"a global kind with a mesh", "/meshes/m2", "mesh: default\n", "mesh: Mesh is global-scoped"},
		{"bad name", "/meshes/default/meshtimeouts/Bad_Name", "{}", `name: "Bad_Name" must be lower-case`},
		{"owner of an unknown kind", "/meshes/default/meshtimeouts/x", "owners: [{kind: Nope, name: a}]\n", `owners[0].kind: unknown kind "Nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			st := newMemStore()
			c := newAPI(t, api.Config{Store: st})
			c.mustPut("/meshes/default", "{}")
			before, err := st.List(t.Context(), "", "")
			g.Expect(err).NotTo(HaveOccurred())

			a := c.do(http.MethodPut, tc.path, tc.body)
			g.Expect(a.status).To(Equal(http.StatusBadRequest), string(a.body))
			g.Expect(a.header.Get("Content-Type")).To(Equal("application/json"))
			e := a.err()
			g.Expect(e.Title).To(Equal("Resource is not valid"))
			g.Expect(e.Details).To(ContainSubstring(tc.details))

			after, err := st.List(t.Context(), "", "")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(after).To(Equal(before))
		})
	}
}

func TestBadSpecOnSQLite(t *testing.T) {
	g := NewWithT(t)
	st, err := store.Open(t.Context(), "", t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = st.Close() })
	c := newAPI(t, api.Config{Store: st})
	c.mustPut("/meshes/default", "{}")

	a := c.do(http.MethodPut, "/meshes/default/meshtimeouts/x", `{"spec":{"default":{"connectionTimeout":"abc"}}}`)
	g.Expect(a.status).To(Equal(http.StatusBadRequest))
	g.Expect(a.err().Causes).To(ConsistOf(api.Cause{Field: "spec.default.connectionTimeout", Message: `"abc" is not a duration (e.g. 10s, 1m30s)`}))
	g.Expect(c.do(http.MethodGet, "/meshes/default/meshtimeouts/x", "").status).To(Equal(http.StatusNotFound))
}

func TestUnknownKindsAndScopes(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore()})
	for _, path := range []string{"/meshgizmos", "/meshgizmos/x", "/meshes/default/meshgizmos", "/meshes/default/meshgizmos/x"} {
		a := c.do(http.MethodGet, path, "")
		g.Expect(a.status).To(Equal(http.StatusNotFound), path)
		g.Expect(a.err().Details).To(And(ContainSubstring(`unknown resource type "meshgizmos"`), ContainSubstring("meshes, meshtimeouts, "+plural("MeshRetry"))), path)
	}
	a := c.do(http.MethodPut, "/meshes/default/meshgizmos/x", "{}")
	g.Expect(a.status).To(Equal(http.StatusNotFound))

	a = c.do(http.MethodGet, "/meshtimeouts/x", "")
	g.Expect(a.status).To(Equal(http.StatusNotFound))
	g.Expect(a.err().Details).To(ContainSubstring("MeshTimeout is mesh-scoped: use /meshes/{mesh}/meshtimeouts/{name}"))

	a = c.do(http.MethodGet, "/meshes/default/meshes/x", "")
	g.Expect(a.status).To(Equal(http.StatusNotFound))
	g.Expect(a.err().Details).To(ContainSubstring("Mesh is global-scoped"))

	a = c.do(http.MethodGet, "/meshes/default/meshtimeouts/x/y", "")
	g.Expect(a.status).To(Equal(http.StatusNotFound))
	g.Expect(a.err().Details).To(ContainSubstring("no route for /meshes/default/meshtimeouts/x/y"))

	a = c.do(http.MethodPost, "/meshes/default/meshtimeouts/x", "{}")
	g.Expect(a.status).To(Equal(http.StatusMethodNotAllowed))
	g.Expect(a.header.Get("Allow")).To(Equal("GET, HEAD, PUT, DELETE"))

	a = c.do(http.MethodGet, "/_resources", "")
	g.Expect(a.status).To(Equal(http.StatusOK))
	var kinds api.Kinds
	g.Expect(json.Unmarshal(a.body, &kinds)).To(Succeed())
	g.Expect(kinds.Resources).To(HaveLen(len(resource.Default().Names())))
	g.Expect(kinds.Resources).To(ContainElements(
		api.KindInfo{Name: "Mesh", Path: "meshes", Scope: "Global"},
		api.KindInfo{Name: "MeshTimeout", Path: "meshtimeouts", Scope: "Mesh"},
	))
}

func TestPolicyOfAMissingMesh(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: st})
		a := c.do(http.MethodPut, "/meshes/nope/meshtimeouts/x", `{"spec":{"default":{"idleTimeout":"1s"}}}`)
		g.Expect(a.status).To(Equal(http.StatusBadRequest), string(a.body))
		g.Expect(a.err().Details).To(Equal(`mesh "nope" does not exist`))
		g.Expect(c.total("/meshtimeouts")).To(Equal(0))
	})
}

func TestGenerationConflict(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: st})
		c.mustPut("/meshes/default", "{}")
		c.mustPut("/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)

		a := c.do(http.MethodPut, "/meshes/default/meshtimeouts/mt-1", "generation: 7\nspec: {}\n")
		g.Expect(a.status).To(Equal(http.StatusConflict), string(a.body))
		g.Expect(a.err().Details).To(ContainSubstring("generation: 7 does not match the stored MeshTimeout/default/mt-1"))

		a = c.do(http.MethodPut, "/meshes/default/meshtimeouts/mt-1", "generation: 1\nspec: {}\n")
		g.Expect(a.status).To(Equal(http.StatusOK), string(a.body))
		g.Expect(a.json()).To(HaveKeyWithValue("generation", BeEquivalentTo(2)))

		// A generation names a version of something stored: there is none for a new resource.
		a = c.do(http.MethodPut, "/meshes/default/meshtimeouts/mt-2", "generation: 1\nspec: {}\n")
		g.Expect(a.status).To(Equal(http.StatusConflict), string(a.body))
		g.Expect(c.do(http.MethodGet, "/meshes/default/meshtimeouts/mt-2", "").status).To(Equal(http.StatusNotFound))
	})
}

func TestDeletingAMeshDeletesItsPolicies(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: st})
		c.mustPut("/meshes/default", "{}")
		c.mustPut("/meshes/other", "{}")
		c.mustPut("/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)

		g.Expect(c.do(http.MethodDelete, "/meshes/default", "").status).To(Equal(http.StatusOK))
		g.Expect(c.total("/meshes/default/meshtimeouts")).To(Equal(0))
		g.Expect(c.total("/meshes/default/" + plural("MeshRetry"))).To(Equal(0))
		g.Expect(c.total("/meshtimeouts")).To(Equal(2))
		g.Expect(c.total("/meshes")).To(Equal(1))
	})
}

func TestZoneIsReadOnly(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		g := NewWithT(t)
		ctx := t.Context()
		_, _, err := st.Put(ctx, resource.Resource{Kind: "Mesh", Name: "default", Spec: []byte("{}")})
		g.Expect(err).NotTo(HaveOccurred())
		c := newAPI(t, api.Config{Store: st, ReadOnly: true, Version: "1.2.3"})

		g.Expect(c.do(http.MethodGet, "/", "").json()).To(Equal(map[string]any{"product": "kds-host", "version": "1.2.3", "mode": "zone"}))
		for _, req := range []struct{ method, path, body string }{
			{http.MethodPut, "/meshes/other", "{}"},
			{http.MethodPut, "/meshes/default/meshtimeouts/x", "{}"},
			{http.MethodDelete, "/meshes/default", ""},
			{http.MethodPut, "/meshes", "{}"},
		} {
			a := c.do(req.method, req.path, req.body)
			g.Expect(a.status).To(Equal(http.StatusMethodNotAllowed), req.path)
			g.Expect(a.err().Details).To(Equal("this is a zone control plane: resources are read-only here; apply them on the global"))
			g.Expect(a.header.Get("Allow")).To(Equal("GET, HEAD"))
		}
		g.Expect(c.total("/meshes")).To(Equal(1))
		// A zone gets its defaults from the global: it makes none.
		g.Expect(c.total("/meshtimeouts")).To(Equal(0))
		g.Expect(c.do(http.MethodGet, "/meshes/default", "").status).To(Equal(http.StatusOK))
	})
}

func TestIndex(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore(), Version: "v9"})
	a := c.do(http.MethodGet, "/", "")
	g.Expect(a.status).To(Equal(http.StatusOK))
	g.Expect(a.body).To(MatchJSON(`{"product":"kds-host","version":"v9","mode":"global"}`))
	g.Expect(c.do(http.MethodHead, "/", "").status).To(Equal(http.StatusOK))
	g.Expect(c.do(http.MethodPost, "/", "").status).To(Equal(http.StatusMethodNotAllowed))
}

func TestStoreErrorsAre500(t *testing.T) {
	g := NewWithT(t)
	st := newMemStore()
	c := newAPI(t, api.Config{Store: st})
	c.mustPut("/meshes/default", "{}")
	st.setFail(errors.New("disk on fire"))
	for _, req := range []struct{ method, path, body string }{
		{http.MethodGet, "/meshes", ""},
		{http.MethodGet, "/meshes/default", ""},
		{http.MethodPut, "/meshes/default/meshtimeouts/x", `{"spec":{"default":{"idleTimeout":"1s"}}}`},
		{http.MethodDelete, "/meshes/default", ""},
	} {
		a := c.do(req.method, req.path, req.body)
		g.Expect(a.status).To(Equal(http.StatusInternalServerError), req.path)
		g.Expect(a.err()).To(HaveField("Details", ContainSubstring("disk on fire")))
	}
}

func TestBodyLimit(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore()})
	big := `{"spec":{"x":"` + strings.Repeat("a", api.MaxBodyBytes) + `"}}`
	a := c.do(http.MethodPut, "/meshes/default", big)
	g.Expect(a.status).To(Equal(http.StatusRequestEntityTooLarge))
	g.Expect(c.total("/meshes")).To(Equal(0))
}

func TestOtherRoutesMountBeside(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore()})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.URL.Path) })
	c.srv.Handle("GET /api/zones", ok)
	c.srv.Handle("GET /api/zones/{zone}", ok)
	c.srv.Handle("POST /api/plugins/reload", ok)
	c.srv.Handle("/healthz", ok)

	for _, p := range []string{"/api/zones", "/api/zones/zone-1", "/healthz"} {
		a := c.do(http.MethodGet, p, "")
		g.Expect(a.status).To(Equal(http.StatusOK), p)
		g.Expect(string(a.body)).To(Equal(p))
	}
	g.Expect(c.do(http.MethodPost, "/api/plugins/reload", "").status).To(Equal(http.StatusOK))
	g.Expect(c.total("/meshes")).To(Equal(0))
}

func TestManyKinds(t *testing.T) {
	g := NewWithT(t)
	reg := resource.Default()
	for i := range 32 {
		reg.MustRegister(resource.Kind{Name: fmt.Sprintf("Gizmo%02d", i), Plural: fmt.Sprintf("gizmo%02ds", i), Scope: resource.ScopeMesh})
	}
	c := newAPI(t, api.Config{Store: newMemStore(), Registry: reg})
	c.mustPut("/meshes/default", "{}")
	for _, k := range reg.Kinds()[len(resource.Default().Names()):] {
		a := c.do(http.MethodPut, "/meshes/default/"+k.Plural+"/g", "spec: {a: 1}")
		g.Expect(a.status).To(Equal(http.StatusCreated), string(a.body))
		g.Expect(a.json()).To(HaveKeyWithValue("type", k.Name))
	}
	g.Expect(c.total("/meshes/default/gizmo31s")).To(Equal(1))
}

func TestMeshDefaultsOfUnservedKindsAreSkipped(t *testing.T) {
	g := NewWithT(t)
	reg := (&resource.Registry{}).MustRegister(
		resource.Kind{Name: "Mesh", Plural: "meshes", Scope: resource.ScopeGlobal},
		resource.Kind{Name: "MeshTimeout", Plural: "meshtimeouts", Scope: resource.ScopeMesh},
	)
	st := newMemStore()
	c := newAPI(t, api.Config{Store: st, Registry: reg})
	c.mustPut("/meshes/default", "{}")
	all, err := st.List(t.Context(), "", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(all).To(HaveLen(3))
}

// Every write path holds the same per-resource limit: a batch item larger than a PUT's body is
// refused by name with 413 and the others are applied (before, POST /api/apply stored a 20 MiB
// resource that PUT refused and sent it to every zone).
func TestABatchItemLargerThanAResourceIsRefusedByItself(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore()})
	big := `{"type":"Mesh","name":"big","labels":{"x":"y"},"spec":{"pad":"` + strings.Repeat("a", api.MaxBodyBytes) + `"}}`
	a := c.do(http.MethodPost, "/api/apply", `{"items":[{"type":"Mesh","name":"small"},`+big+`]}`)
	g.Expect(a.status).To(Equal(http.StatusOK))
	var resp api.BatchResponse
	g.Expect(json.Unmarshal(a.body, &resp)).To(Succeed())
	g.Expect(resp.Applied).To(Equal(1))
	g.Expect(resp.Items[1].Error).To(And(Not(BeNil()), HaveField("Details", ContainSubstring("item 1: "))))
	g.Expect(c.total("/meshes")).To(Equal(1))
}

// A resource larger than one KDS response (--kds-max-message) is refused at the API with the
// limit named, by PUT and by a batch alike.
func TestAResourceLargerThanAKDSMessageIsRefused(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: newMemStore(), MaxResourceWireBytes: 1000})
	var labels []string
	for i := range 30 {
		labels = append(labels, fmt.Sprintf(`"label-%02d":%q`, i, strings.Repeat("v", 60)))
	}
	doc := `{"type":"Mesh","name":"m","labels":{` + strings.Join(labels, ",") + `}}`
	a := c.do(http.MethodPut, "/meshes/m", doc)
	g.Expect(a.status).To(Equal(http.StatusRequestEntityTooLarge))
	g.Expect(a.err().Details).To(ContainSubstring("--kds-max-message"))
	a = c.do(http.MethodPost, "/api/apply", `{"items":[`+doc+`]}`)
	var resp api.BatchResponse
	g.Expect(json.Unmarshal(a.body, &resp)).To(Succeed())
	g.Expect(resp.Items[0].Error).To(HaveField("Details", ContainSubstring("--kds-max-message")))
	g.Expect(c.do(http.MethodPut, "/meshes/m", `{"type":"Mesh","name":"m"}`).status).To(Equal(http.StatusCreated))
}

// blockingStore is a store whose reads wait until their context ends (a locked table, a store
// that does not answer).
type blockingStore struct{ *memStore }

func (blockingStore) Get(ctx context.Context, _ resource.Key) (resource.Resource, error) {
	<-ctx.Done()
	return resource.Resource{}, ctx.Err()
}

// A request whose store work does not finish within the store deadline answers 503 with
// Retry-After instead of waiting (before: over 8 s on a locked table, with no deadline).
func TestAStoreThatDoesNotAnswerGets503WithRetryAfter(t *testing.T) {
	g := NewWithT(t)
	c := newAPI(t, api.Config{Store: blockingStore{newMemStore()}, StoreTimeout: 50 * time.Millisecond})
	a := c.do(http.MethodGet, "/meshes/default", "")
	g.Expect(a.status).To(Equal(http.StatusServiceUnavailable))
	g.Expect(a.header.Get("Retry-After")).To(Equal("1"))
	g.Expect(a.err().Details).To(ContainSubstring("(50ms, a batch 300ms)"))
}

package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// badMeshTimeouts are issue 17's three: an unknown spec field, a targetRef.kind that does not
// exist, no spec at all. Each is answered 400 naming the field, and nothing is stored.
var badMeshTimeouts = []struct {
	name, body string
	cause      api.Cause
}{
	{"unknown spec field", "spec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: 2s, bogus: 1}\n",
		api.Cause{Field: "spec.default.bogus", Message: "unknown field (known: connectionTimeout, http, idleTimeout)"}},
	{"unknown targetRef kind", `{"spec":{"targetRef":{"kind":"Nope"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}]}}`,
		api.Cause{Field: "spec.targetRef.kind", Message: `unknown kind "Nope" (known: Mesh, MeshSubset, MeshService, MeshServiceSubset, MeshGateway, MeshHTTPRoute, MeshExternalService, MeshMultiZoneService)`}},
	{"no spec", "labels: {team: a}\n",
		api.Cause{Field: "spec", Message: "is required for MeshTimeout"}},
}

func TestBadMeshTimeoutsAre400sNamingTheField(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		for _, tc := range badMeshTimeouts {
			t.Run(tc.name, func(t *testing.T) {
				g := NewWithT(t)
				c := newAPI(t, api.Config{Store: st})
				c.mustPut("/meshes/default", "{}")
				before, err := st.List(t.Context(), "", "")
				g.Expect(err).NotTo(HaveOccurred())

				a := c.do(http.MethodPut, "/meshes/default/meshtimeouts/bad", tc.body)
				g.Expect(a.status).To(Equal(http.StatusBadRequest), string(a.body))
				e := a.err()
				g.Expect(e.Title).To(Equal("Resource is not valid"))
				g.Expect(e.Details).To(Equal(tc.cause.Field + ": " + tc.cause.Message))
				g.Expect(e.Causes).To(ConsistOf(tc.cause))

				// The same answer for it as the item of a batch.
				res, apiErr := api.DecodeResource([]byte(tc.body))
				g.Expect(apiErr).To(BeNil())
				res.Kind, res.Mesh, res.Name = "MeshTimeout", "default", "bad"
				item, err := json.Marshal(res)
				g.Expect(err).NotTo(HaveOccurred())
				body, err := json.Marshal(api.BatchRequest{Items: []json.RawMessage{item}})
				g.Expect(err).NotTo(HaveOccurred())
				a = c.do(http.MethodPost, "/api/apply", string(body))
				g.Expect(a.status).To(Equal(http.StatusOK), string(a.body))
				var resp api.BatchResponse
				g.Expect(json.Unmarshal(a.body, &resp)).To(Succeed())
				g.Expect(resp.Failed).To(Equal(1))
				g.Expect(resp.Items[0].Error.Causes).To(ConsistOf(tc.cause))

				g.Expect(c.do(http.MethodGet, "/meshes/default/meshtimeouts/bad", "").status).To(Equal(http.StatusNotFound))
				after, err := st.List(t.Context(), "", "")
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(after).To(Equal(before), "nothing stored")
			})
		}
	})
}

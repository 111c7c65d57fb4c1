package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// A store without room to write answers 507 naming the cause, for a PUT, a DELETE and a batch
// alike; one short of other resources answers 503 with Retry-After.
func TestAStoreOutOfSpaceAnswers507(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		says   string
	}{
		{"out of space", fmt.Errorf("put x: %w: database or disk is full (13)", store.ErrNoSpace), http.StatusInsufficientStorage, "database or disk is full"},
		{"short of resources", fmt.Errorf("put x: %w: too many connections", store.ErrInsufficientResources), http.StatusServiceUnavailable, "too many connections"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			st := newMemStore()
			c := newAPI(t, api.Config{Store: st})
			c.mustPut("/meshes/default", "{}")
			st.setFail(tc.err)
			for _, req := range []struct{ method, path, body string }{
				{http.MethodPut, "/meshes/default/meshtimeouts/x", `{"spec":{"default":{"idleTimeout":"1s"}}}`},
				{http.MethodDelete, "/meshes/default", ""},
			} {
				a := c.do(req.method, req.path, req.body)
				g.Expect(a.status).To(Equal(tc.status), req.method)
				g.Expect(a.err().Details).To(ContainSubstring(tc.says))
			}
			a := c.do(http.MethodPost, "/api/apply", `{"items":[{"type":"Mesh","name":"other"}]}`)
			var resp api.BatchResponse
			g.Expect(json.Unmarshal(a.body, &resp)).To(Succeed())
			g.Expect(resp.Items[0].Status).To(Equal(tc.status))
			g.Expect(errors.Is(tc.err, store.ErrNoSpace) == (tc.status == http.StatusInsufficientStorage)).To(BeTrue())
		})
	}
}

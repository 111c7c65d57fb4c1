package api_test

import (
	"net/http"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
)

// Listing a kind with a stored row the store cannot read (labels written by hand) answers 200
// with the rest, and names the row, its column and the error; a GET of the row is an error that
// names the column; a PUT of it fixes it. Before, the list answered 500 ("stored labels: invalid
// character"), so `kds-host get` failed for the whole kind.
func TestListingAKindWithAnUnreadableRowAnswersTheRestAndNamesIt(t *testing.T) {
	sqlBackends(t, func(t *testing.T, db database) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: db.Store})
		c.mustPut("/meshes/default", "type: Mesh\nname: default\n") // and 2 default MeshTimeouts
		c.mustPut("/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)
		c.mustPut("/meshes/default/meshtimeouts/mt-2", "type: MeshTimeout\nspec: {}\n")
		db.exec(t, `UPDATE resources SET labels = '{"team":' WHERE name = 'mt-1'`)

		a := c.do(http.MethodGet, "/meshes/default/meshtimeouts", "")
		g.Expect(a.status).To(Equal(http.StatusOK), string(a.body))
		l := a.list()
		g.Expect(l.Total).To(Equal(3))
		g.Expect(l.Items).To(HaveEach(HaveField("Name", Not(Equal("mt-1")))))
		g.Expect(l.Unreadable).To(HaveExactElements(api.UnreadableRow{Mesh: "default", Name: "mt-1", Column: "labels", Error: "unexpected end of JSON input"}))
		g.Expect(c.do(http.MethodGet, "/meshes/default/meshretries", "").list().Unreadable).To(BeEmpty(), "only the list that holds it")

		a = c.do(http.MethodGet, "/meshes/default/meshtimeouts/mt-1", "")
		g.Expect(a.status).To(Equal(http.StatusInternalServerError))
		g.Expect(a.err().Details).To(Equal("MeshTimeout/default/mt-1 is stored, but its labels cannot be read (unexpected end of JSON input): apply it again, or delete it"))
		g.Expect(a.err().Causes).To(HaveExactElements(api.Cause{Field: "labels", Message: "unexpected end of JSON input"}))

		c.mustPut("/meshes/default/meshtimeouts/mt-1", meshTimeoutYAML)
		l = c.do(http.MethodGet, "/meshes/default/meshtimeouts", "").list()
		g.Expect(l.Total).To(Equal(4))
		g.Expect(l.Unreadable).To(BeEmpty())
		g.Expect(c.do(http.MethodGet, "/meshes/default/meshtimeouts/mt-1", "").json()).To(HaveKeyWithValue("labels", HaveKeyWithValue("team", "payments")))
	})
}

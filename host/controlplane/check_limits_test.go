package controlplane_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
)

// POST /api/check holds the API's bounds: a resource nesting deeper than api.MaxNestingDepth is a
// 400 naming the limit, found by a scan before anything is decoded, and a body over its limit
// is a 413 (before: cut at 16 MiB and refused as broken JSON).
func TestCheckRefusesABodyThatNestsTooDeepOrIsTooLarge(t *testing.T) {
	g := NewWithT(t)
	gl := startGlobal(t, openSQLite(t), resource.Default())
	post := func(body string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+gl.APIAddr()+"/api/check", strings.NewReader(body))
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Authorization", "Bearer "+adminToken(t))
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deep := `{"resources":[{"type":"Mesh","name":"m","spec":` + strings.Repeat(`{"a":`, api.MaxNestingDepth) + "1" + strings.Repeat("}", api.MaxNestingDepth) + `}]}`
	code, body := post(deep)
	g.Expect(code).To(Equal(http.StatusBadRequest))
	g.Expect(body).To(ContainSubstring("a resource nests more than 100 levels of objects and lists (at byte "))

	code, body = post(`{"resources":[{"type":"Mesh","name":"m","spec":{"pad":"` + strings.Repeat("a", 16<<20) + `"}}]}`)
	g.Expect(code).To(Equal(http.StatusRequestEntityTooLarge), body)
}

package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// call sends body to the global's API with the admin token and returns the status and the body.
func call(t *testing.T, gl *runningGlobal, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+gl.APIAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken(t))
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// codeOf is the status of a call's answer.
func codeOf(code int, _ string) int { return code }

// readyz is the status and the body of the global's /readyz.
func readyz(t *testing.T, gl *runningGlobal) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + gl.DiagAddr() + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// bigTimeout is a MeshTimeout document of about 256 KiB: more than a full database has room for.
func bigTimeout(name string) string {
	return fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":%q,"spec":{"targetRef":{"kind":"MeshSubset","tags":{"pad":%q}},"default":{"connectionTimeout":"1s"}}}`,
		name, strings.Repeat("p", 256<<10))
}

// A full disk (a SQLite database at its max_page_count) is an error the operator can read: writes
// answer 507 naming the cause, a batch fails whole, /readyz fails and kds_store_up reads 0; once
// there is room again the next write succeeds, readiness comes back by itself, and every write
// acknowledged before is there. (Before: 500 "no such savepoint" and ready all along.)
func TestAFullDiskAnswers507AndFailsReadinessUntilThereIsRoomAgain(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	st := openSQLite(t)
	gl := startGlobal(t, st, resource.Default())
	g.Eventually(func() int { code, _ := readyz(t, gl); return code }, 10*time.Second).Should(Equal(http.StatusOK))
	acked := []string{"/meshes/default"}
	g.Expect(codeOf(call(t, gl, http.MethodPut, "/meshes/default", `{}`))).To(Equal(http.StatusCreated))
	for i := range 10 {
		path := fmt.Sprintf("/meshes/default/meshtimeouts/t%02d", i)
		code, body := call(t, gl, http.MethodPut, path, `{"spec":{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"1s"}}}`)
		g.Expect(code).To(Equal(http.StatusCreated), body)
		acked = append(acked, path)
	}

	_, err := store.LimitPages(ctx, st, 1)
	g.Expect(err).NotTo(HaveOccurred())
	code, body := call(t, gl, http.MethodPut, "/meshes/default/meshtimeouts/big", bigTimeout("big"))
	g.Expect(code).To(Equal(http.StatusInsufficientStorage), body)
	var e api.Error
	g.Expect(json.Unmarshal([]byte(body), &e)).To(Succeed())
	g.Expect(e.Title).To(Equal("Store out of space"))
	g.Expect(e.Details).To(And(ContainSubstring("no space left to write the database"), ContainSubstring("database or disk is full")))

	code, body = call(t, gl, http.MethodPost, "/api/apply", `{"items":[{"type":"MeshRetry","mesh":"default","name":"small","spec":{}},`+bigTimeout("big")+`]}`)
	g.Expect(code).To(Equal(http.StatusInsufficientStorage), "the batch fails whole: %s", body)
	g.Expect(body).NotTo(ContainSubstring("savepoint"))

	g.Eventually(func() string { _, body := readyz(t, gl); return body }, 10*time.Second).Should(ContainSubstring("no space left to write"))
	code, _ = readyz(t, gl)
	g.Expect(code).To(Equal(http.StatusServiceUnavailable))
	g.Expect(sampleOf(t, gl.DiagAddr(), "kds_store_up", "")()).To(Equal(0.0))
	g.Expect(codeOf(call(t, gl, http.MethodGet, "/meshes/default/meshtimeouts/t00", ""))).To(Equal(http.StatusOK), "reads go on")

	_, err = store.LimitPages(ctx, st, 1<<30)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() int { code, _ := readyz(t, gl); return code }, 10*time.Second).Should(Equal(http.StatusOK), "the probe finds room")
	g.Expect(sampleOf(t, gl.DiagAddr(), "kds_store_up", "")()).To(Equal(1.0))
	g.Expect(codeOf(call(t, gl, http.MethodPut, "/meshes/default/meshtimeouts/big", bigTimeout("big")))).To(Equal(http.StatusCreated))
	for _, path := range acked {
		g.Expect(codeOf(call(t, gl, http.MethodGet, path, ""))).To(Equal(http.StatusOK), path)
	}
}

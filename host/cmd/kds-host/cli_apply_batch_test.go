package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// manyDocs is a Mesh and n-1 MeshTimeouts in it, as one multi-document YAML file.
func manyDocs(n int) string {
	var b strings.Builder
	b.WriteString("type: Mesh\nname: default\n")
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "---\ntype: MeshTimeout\nmesh: default\nname: t-%05d\nspec:\n  targetRef: {kind: Mesh}\n  default: {connectionTimeout: %ds}\n", i, 1+i%50)
	}
	return b.String()
}

// batchAPI serves a global's API over SQLite and counts the batch requests.
func batchAPI(t testing.TB) (url string, batches *atomic.Int64, st store.Store) {
	s, err := store.Open(t.Context(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	h := api.New(api.Config{Store: s, Version: "test"}).Handler()
	batches = &atomic.Int64{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/apply" {
			batches.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, batches, s
}

// One apply of 2,500 documents: 3 batches of at most 1,000, 3 store revisions, every result
// printed in document order.
func TestApplyBatchesDocuments(t *testing.T) {
	g := NewWithT(t)
	cp, batches, st := batchAPI(t)
	r := runCLI(t, "", "apply", "-f", writeFile(t, "many.yaml", manyDocs(2500)), "--cp", cp)
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	g.Expect(lines).To(HaveLen(2500))
	g.Expect(lines[0]).To(Equal(`mesh "default" created`))
	g.Expect(lines[2499]).To(Equal(`meshtimeout "t-02499" created`))
	g.Expect(batches.Load()).To(Equal(int64(3)))
	rev, err := st.Revision(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rev).To(Equal(int64(3)), "a revision a batch, not a document")
}

// BenchmarkApply10000Documents is one `kds-host apply -f` of 10,000 documents through the API
// into SQLite.
func BenchmarkApply10000Documents(b *testing.B) {
	file := writeFileB(b, manyDocs(10_000))
	for b.Loop() {
		b.StopTimer()
		cp, _, _ := batchAPI(b)
		b.StartTimer()
		root := newRootCmd()
		root.SetArgs([]string{"apply", "-f", file, "--cp", cp})
		var out strings.Builder
		root.SetOut(&out)
		if err := root.Execute(); err != nil {
			b.Fatal(err)
		}
	}
}

func writeFileB(b *testing.B, content string) string {
	b.Helper()
	p := filepath.Join(b.TempDir(), "many.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		b.Fatal(err)
	}
	return p
}

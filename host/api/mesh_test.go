package api_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// database is a real store and what a test needs to reach under it: the database/sql driver
// and DSN, to add a trigger the store knows nothing about.
type database struct {
	store.Store
	driver, dsn string
}

// sqlBackends runs a test against a fresh SQLite file and a fresh PostgreSQL database.
func sqlBackends(t *testing.T, test func(t *testing.T, db database)) {
	open := func(t *testing.T, dsn, dataDir string) store.Store {
		st, err := store.Open(context.Background(), dsn, dataDir)
		if err != nil {
			t.Fatalf("open store: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		test(t, database{Store: open(t, "", dir), driver: "sqlite", dsn: filepath.Join(dir, store.DefaultSQLiteFile)})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pg.Database(t)
		test(t, database{Store: open(t, dsn, ""), driver: "pgx", dsn: dsn})
	})
}

// exec runs statements on the database directly, beside the store.
func (db database) exec(t *testing.T, stmts ...string) {
	t.Helper()
	conn, err := sql.Open(db.driver, db.dsn)
	if err != nil {
		t.Fatalf("open %s beside the store: %v", db.driver, err)
	}
	defer conn.Close()
	for _, s := range stmts {
		if _, err := conn.ExecContext(t.Context(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// defaultKeys are the keys resource.MeshDefaults makes for mesh.
func defaultKeys(mesh string) []string {
	var out []string
	for _, d := range resource.MeshDefaults(mesh) {
		out = append(out, d.Key().String())
	}
	return out
}

func keysOf(rs []resource.Resource) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Key().String())
	}
	return out
}

// put is one PUT that reports "STATUS RESULT" (e.g. "201 created"), safe to call from any
// goroutine.
func put(ctx context.Context, url, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode >= 300 {
		return "", fmt.Errorf("PUT %s: %d %s", url, resp.StatusCode, b)
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get(api.ResultHeader)), nil
}

func TestConcurrentCreatesOfOneMeshMakeOneSetOfDefaults(t *testing.T) {
	const creators = 20
	sqlBackends(t, func(t *testing.T, db database) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: db})

		start := make(chan struct{})
		results, errs := make(chan string, creators), make(chan error, creators)
		var wg sync.WaitGroup
		for range creators {
			wg.Go(func() {
				<-start
				r, err := put(t.Context(), c.url+"/meshes/m", "type: Mesh\nname: m\n")
				if err != nil {
					errs <- err
					return
				}
				results <- r
			})
		}
		close(start)
		wg.Wait()
		close(results)
		close(errs)
		for err := range errs {
			g.Expect(err).NotTo(HaveOccurred())
		}
		counts := map[string]int{}
		for r := range results {
			counts[r]++
		}
		g.Expect(counts).To(Equal(map[string]int{"201 created": 1, "200 unchanged": creators - 1}))

		stored, err := db.List(t.Context(), "", "m")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keysOf(stored)).To(ConsistOf(defaultKeys("m")))
		g.Expect(stored).To(HaveEach(HaveField("Generation", int64(1))))
		// The Mesh and its defaults were one write.
		rev, err := db.Revision(t.Context())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(rev).To(Equal(int64(1)))
	})
}

func TestAMeshWhoseDefaultsFailIsNotStored(t *testing.T) {
	// The database refuses the third default, in the middle of the Mesh's transaction.
	const refused = "mesh-retry-all-default"
	sqlBackends(t, func(t *testing.T, db database) {
		g := NewWithT(t)
		c := newAPI(t, api.Config{Store: db})
		if db.driver == "sqlite" {
			db.exec(t, `CREATE TRIGGER refuse_default BEFORE INSERT ON resources WHEN NEW.name = '`+refused+`'
				BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`)
		} else {
			db.exec(t, `CREATE FUNCTION refuse_default() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN RAISE EXCEPTION 'refused by the test'; END $$`,
				`CREATE TRIGGER refuse_default BEFORE INSERT ON resources FOR EACH ROW
				WHEN (NEW.name = '`+refused+`') EXECUTE FUNCTION refuse_default()`)
		}

		a := c.do(http.MethodPut, "/meshes/m", "type: Mesh\nname: m\n")
		g.Expect(a.status).To(Equal(http.StatusInternalServerError), string(a.body))
		g.Expect(a.err().Details).To(ContainSubstring("refused by the test"))
		g.Expect(a.err().Details).To(ContainSubstring(refused))
		g.Expect(c.do(http.MethodGet, "/meshes/m", "").status).To(Equal(http.StatusNotFound))
		all, err := db.List(t.Context(), "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(all).To(BeEmpty())

		// Once the database takes them, the same PUT creates the Mesh and all of its defaults.
		db.exec(t, `DROP TRIGGER refuse_default`+map[string]string{"sqlite": "", "pgx": " ON resources"}[db.driver])
		a = c.do(http.MethodPut, "/meshes/m", "type: Mesh\nname: m\n")
		g.Expect(a.status).To(Equal(http.StatusCreated), string(a.body))
		g.Expect(a.header.Get(api.ResultHeader)).To(Equal("created"))
		all, err = db.List(t.Context(), "", "m")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keysOf(all)).To(ConsistOf(defaultKeys("m")))
	})
}

func TestAMeshWhoseDefaultsFailIsNotStoredInMemory(t *testing.T) {
	g := NewWithT(t)
	st := newMemStore()
	refused := resource.Key{Kind: "MeshRetry", Mesh: "m", Name: "mesh-retry-all-default"}
	st.refuse(refused, errors.New("disk full"))
	c := newAPI(t, api.Config{Store: st})

	a := c.do(http.MethodPut, "/meshes/m", "{}")
	g.Expect(a.status).To(Equal(http.StatusInternalServerError), string(a.body))
	g.Expect(a.err().Details).To(ContainSubstring("disk full"))
	g.Expect(c.do(http.MethodGet, "/meshes/m", "").status).To(Equal(http.StatusNotFound))
	all, err := st.List(t.Context(), "", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(all).To(BeEmpty())
}

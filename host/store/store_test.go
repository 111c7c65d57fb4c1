package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store/pgtest"
)

// pg is the package's PostgreSQL server, started by the first test that needs it.
var pg pgtest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	if err := pg.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// eachBackend runs fn against a fresh SQLite file and a fresh PostgreSQL database, as subtests
// of a test or sub-benchmarks of a benchmark.
func eachBackend[T interface {
	testing.TB
	Run(name string, f func(T)) bool
}](t T, fn func(t T, dsn string)) {
	t.Helper()
	t.Run("sqlite", func(t T) { fn(t, filepath.Join(t.TempDir(), "kds.db")) })
	t.Run("postgres", func(t T) { fn(t, pg.Database(t)) })
}

func openStore(t testing.TB, dsn string) Store {
	t.Helper()
	s, err := Open(context.Background(), dsn, "")
	if err != nil {
		t.Fatalf("open %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mesh(name string) resource.Resource {
	return resource.Resource{Kind: resource.MeshKind, Name: name, Spec: json.RawMessage(`{}`)}
}

func policy(kind, mesh, name, spec string) resource.Resource {
	return resource.Resource{Kind: kind, Mesh: mesh, Name: name, Spec: json.RawMessage(spec),
		Labels: map[string]string{"team": "a", "env": "test"}}
}

func keys(rs []resource.Resource) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Key().String())
	}
	return out
}

func revision(t *testing.T, s Store) int64 {
	t.Helper()
	v, err := s.Revision(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCRUD(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)

		for _, r := range []resource.Resource{
			mesh("default"), mesh("other"),
			policy("MeshTimeout", "default", "t2", `{"b":1}`),
			policy("MeshTimeout", "default", "t1", `{"a":"5s"}`),
			policy("MeshRetry", "default", "r1", `{}`),
			policy("MeshTimeout", "other", "t1", `{}`),
		} {
			stored, changed, err := s.Put(ctx, r)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(BeTrue())
			g.Expect(stored.Generation).To(Equal(int64(1)))
		}

		want := policy("MeshTimeout", "default", "t1", `{"a":"5s"}`)
		want.Owners = nil
		want.Generation = 1
		got, err := s.Get(ctx, want.Key())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.CreationTime).NotTo(BeZero(), "the store stamps it")
		g.Expect(got.ModificationTime).To(Equal(got.CreationTime))
		got.CreationTime, got.ModificationTime = time.Time{}, time.Time{}
		g.Expect(got).To(Equal(want))

		m, err := s.Get(ctx, resource.Key{Kind: resource.MeshKind, Name: "default"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(m.Labels).To(BeNil())
		g.Expect(string(m.Spec)).To(Equal(`{}`))

		for _, tc := range []struct {
			kind, mesh string
			want       []string
		}{
			{"", "", []string{"Mesh/default", "Mesh/other", "MeshRetry/default/r1", "MeshTimeout/default/t1", "MeshTimeout/default/t2", "MeshTimeout/other/t1"}},
			{"MeshTimeout", "", []string{"MeshTimeout/default/t1", "MeshTimeout/default/t2", "MeshTimeout/other/t1"}},
			{"", "default", []string{"MeshRetry/default/r1", "MeshTimeout/default/t1", "MeshTimeout/default/t2"}},
			{"MeshTimeout", "other", []string{"MeshTimeout/other/t1"}},
			{"MeshHealthCheck", "", []string{}},
		} {
			l, err := s.List(ctx, tc.kind, tc.mesh)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(keys(l)).To(Equal(tc.want), "List(%q, %q)", tc.kind, tc.mesh)
		}

		g.Expect(s.Delete(ctx, want.Key())).To(Succeed())
		_, err = s.Get(ctx, want.Key())
		g.Expect(err).To(MatchError(ErrNotFound))
		g.Expect(err.Error()).To(ContainSubstring("MeshTimeout/default/t1"))
		err = s.Delete(ctx, want.Key())
		g.Expect(err).To(MatchError(ErrNotFound))
		g.Expect(err.Error()).To(HavePrefix("delete MeshTimeout/default/t1: "))
	})
}

func TestPutGenerations(t *testing.T) {
	type step struct {
		name        string
		labels      map[string]string
		owners      []resource.Key
		spec        string
		generation  int64 // given
		wantErr     error
		wantChanged bool
		wantGen     int64 // stored afterwards
	}
	steps := []step{
		{name: "create with a generation is a conflict", spec: `{"a":1}`, generation: 3, wantErr: ErrConflict, wantGen: 0},
		{name: "create", spec: `{"a":1}`, wantChanged: true, wantGen: 1},
		{name: "identical is a no-op", spec: `{"a":1}`, wantGen: 1},
		{name: "identical after canonicalisation is a no-op", spec: " { \"a\" : 1 } ", labels: map[string]string{}, owners: []resource.Key{}, wantGen: 1},
		{name: "identical with the right generation is a no-op", spec: `{"a":1}`, generation: 1, wantGen: 1},
		{name: "spec change bumps", spec: `{"a":2}`, wantChanged: true, wantGen: 2},
		{name: "label change bumps", spec: `{"a":2}`, labels: map[string]string{"x": "y"}, wantChanged: true, wantGen: 3},
		{name: "owner change bumps", spec: `{"a":2}`, labels: map[string]string{"x": "y"}, owners: []resource.Key{{Kind: "Mesh", Name: "m"}}, wantChanged: true, wantGen: 4},
		{name: "right generation", spec: `{"a":3}`, generation: 4, wantChanged: true, wantGen: 5},
		{name: "stale generation", spec: `{"a":4}`, generation: 4, wantErr: ErrConflict, wantGen: 5},
		{name: "stale generation with identical content", spec: `{"a":3}`, generation: 2, wantErr: ErrConflict, wantGen: 5},
		{name: "key order does not matter", spec: `{"b":{"y":1,"x":2},"a":3}`, wantChanged: true, wantGen: 6},
		{name: "key order does not matter, again", spec: `{"a":3,"b":{"x":2,"y":1}}`, wantGen: 6},
	}
	eachBackend(t, func(t *testing.T, dsn string) {
		ctx, s := context.Background(), openStore(t, dsn)
		if _, _, err := s.Put(ctx, mesh("m")); err != nil {
			t.Fatal(err)
		}
		key := resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: "t"}
		for _, st := range steps {
			g := NewWithT(t)
			rev := revision(t, s)
			drain(s)
			r := resource.Resource{Kind: key.Kind, Mesh: key.Mesh, Name: key.Name, Labels: st.labels,
				Owners: st.owners, Spec: json.RawMessage(st.spec), Generation: st.generation}
			stored, changed, err := s.Put(ctx, r)
			if st.wantErr != nil {
				g.Expect(err).To(MatchError(st.wantErr), st.name)
				g.Expect(err.Error()).To(HavePrefix("put MeshTimeout/m/t: "), st.name)
			} else {
				g.Expect(err).NotTo(HaveOccurred(), st.name)
				g.Expect(changed).To(Equal(st.wantChanged), st.name)
				g.Expect(stored.Generation).To(Equal(st.wantGen), st.name)
				got, err := s.Get(ctx, key)
				g.Expect(err).NotTo(HaveOccurred(), st.name)
				g.Expect(got).To(Equal(stored), "%s: Put returns what Get reads", st.name)
			}
			if st.wantGen > 0 {
				got, err := s.Get(ctx, key)
				g.Expect(err).NotTo(HaveOccurred(), st.name)
				g.Expect(got.Generation).To(Equal(st.wantGen), st.name)
			}
			if st.wantChanged {
				g.Expect(revision(t, s)).To(Equal(rev+1), st.name)
				g.Expect(s.Changes()).To(Receive(), st.name)
			} else {
				g.Expect(revision(t, s)).To(Equal(rev), st.name)
				g.Expect(s.Changes()).NotTo(Receive(), st.name)
			}
		}
	})
}

func drain(s Store) {
	select {
	case <-s.Changes():
	default:
	}
}

func TestMissingMeshIsRefusedByTheDatabase(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		rev := revision(t, s)
		p := policy("MeshTimeout", "absent", "t", `{}`)
		_, changed, err := s.Put(ctx, p)
		var moe *MissingOwnerError
		g.Expect(errors.As(err, &moe)).To(BeTrue(), "got %v", err)
		g.Expect(moe.Key).To(Equal(p.Key()))
		g.Expect(moe.Owner).To(Equal(resource.Key{Kind: resource.MeshKind, Name: "absent"}))
		g.Expect(changed).To(BeFalse())
		g.Expect(revision(t, s)).To(Equal(rev))
		_, err = s.Get(ctx, p.Key())
		g.Expect(err).To(MatchError(ErrNotFound))

		// The same resource is accepted once its Mesh exists.
		_, _, err = s.Put(ctx, mesh("absent"))
		g.Expect(err).NotTo(HaveOccurred())
		_, changed, err = s.Put(ctx, p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeTrue())

		// The constraint is the database's, not the Go code's: a raw insert is refused too.
		ss := s.(*sqlStore)
		_, err = ss.w.ExecContext(ctx, ss.d.rebind(`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation)
			VALUES ('MeshRetry', 'nope', 'r', 'nope', '{}', '[]', '{}', 1)`))
		g.Expect(ss.d.isForeignKeyViolation(err)).To(BeTrue(), "got %v", err)
		_, err = ss.w.ExecContext(ctx, ss.d.rebind(`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation)
			VALUES ('MeshRetry', 'nope', 'r', NULL, '{}', '[]', '{}', 1)`))
		g.Expect(err).To(HaveOccurred(), "a mesh-scoped row without mesh_ref violates a CHECK")
	})
}

func TestApplyPartial(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		_, _, err := s.Put(ctx, mesh("old"))
		g.Expect(err).NotTo(HaveOccurred())
		_, _, err = s.Put(ctx, policy("MeshRetry", "old", "gone", `{}`))
		g.Expect(err).NotTo(HaveOccurred())
		rev := revision(t, s)
		drain(s)

		withGen := func(r resource.Resource, gen int64) resource.Resource { r.Generation = gen; return r }
		puts := []resource.Resource{
			// Policies first and their Mesh last: Apply writes Meshes first.
			withGen(policy("MeshTimeout", "m", "ok-1", `{"a":1}`), 7),
			withGen(policy("MeshTimeout", "missing", "bad-1", `{}`), 1),
			withGen(policy("MeshRetry", "m", "ok-2", `{}`), 2),
			withGen(policy("MeshRetry", "missing", "bad-2", `{}`), 1),
			withGen(policy("MeshTimeout", "old", "ok-3", `{}`), 1),
			{Kind: resource.MeshKind, Mesh: "x", Name: "bad-mesh"}, // a Mesh takes no mesh
			withGen(mesh("m"), 3),
		}
		deletes := []resource.Key{
			{Kind: "MeshRetry", Mesh: "old", Name: "gone"},
			{Kind: "MeshRetry", Mesh: "old", Name: "never-was"},
			{Kind: resource.MeshKind, Name: "never-was"},
		}
		failed, err := s.Apply(ctx, puts, deletes)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(failed).To(HaveLen(3))
		for _, k := range []resource.Key{puts[1].Key(), puts[3].Key()} {
			var moe *MissingOwnerError
			g.Expect(errors.As(failed[k], &moe)).To(BeTrue(), "%s: %v", k, failed[k])
			g.Expect(moe.Key).To(Equal(k))
			g.Expect(moe.Owner).To(Equal(resource.Key{Kind: resource.MeshKind, Name: "missing"}))
		}
		g.Expect(failed[puts[5].Key()]).To(MatchError(ContainSubstring("takes no mesh")))

		l, err := s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m", "Mesh/old", "MeshRetry/m/ok-2", "MeshTimeout/m/ok-1", "MeshTimeout/old/ok-3"}))
		got, err := s.Get(ctx, puts[0].Key())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.Generation).To(Equal(int64(7)), "generation written as given")
		m, err := s.Get(ctx, resource.Key{Kind: resource.MeshKind, Name: "m"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(m.Generation).To(Equal(int64(3)))

		g.Expect(revision(t, s)).To(Equal(rev+1), "one transaction, one revision")
		g.Expect(s.Changes()).To(Receive())

		// The same batch again changes nothing.
		failed, err = s.Apply(ctx, puts[:1], deletes)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(failed).To(BeEmpty())
		g.Expect(revision(t, s)).To(Equal(rev + 1))
		g.Expect(s.Changes()).NotTo(Receive())

		// A Mesh deleted in the batch takes what the batch put into it.
		failed, err = s.Apply(ctx, []resource.Resource{policy("MeshTimeout", "old", "late", `{}`)},
			[]resource.Key{{Kind: resource.MeshKind, Name: "old"}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(failed).To(BeEmpty())
		l, err = s.List(ctx, "", "old")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l).To(BeEmpty())
		g.Expect(revision(t, s)).To(Equal(rev + 2))

		// An empty batch is not a write.
		failed, err = s.Apply(ctx, nil, nil)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(failed).To(BeEmpty())
		g.Expect(revision(t, s)).To(Equal(rev + 2))
	})
}

func TestApplyCanceled(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, s := NewWithT(t), openStore(t, dsn)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.Apply(ctx, []resource.Resource{mesh("m")}, nil)
		g.Expect(err).To(MatchError(context.Canceled))
		_, err = s.Get(context.Background(), resource.Key{Kind: resource.MeshKind, Name: "m"})
		g.Expect(err).To(MatchError(ErrNotFound))
	})
}

// putTwoMeshes stores Mesh a with a MeshTimeout and a MeshRetry, and Mesh b with a MeshTimeout.
func putTwoMeshes(t *testing.T, s Store) {
	t.Helper()
	for _, r := range []resource.Resource{
		mesh("a"), mesh("b"),
		policy("MeshTimeout", "a", "t", `{}`), policy("MeshRetry", "a", "r", `{}`),
		policy("MeshTimeout", "b", "t", `{}`),
	} {
		if _, _, err := s.Put(context.Background(), r); err != nil {
			t.Fatalf("put %s: %v", r.Key(), err)
		}
	}
}

func TestDeleteMeshCascades(t *testing.T) {
	for _, via := range []string{"Delete", "Apply"} {
		t.Run(via, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, dsn string) {
				g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
				putTwoMeshes(t, s)
				rev := revision(t, s)
				meshA := resource.Key{Kind: resource.MeshKind, Name: "a"}
				if via == "Delete" {
					g.Expect(s.Delete(ctx, meshA)).To(Succeed())
				} else {
					failed, err := s.Apply(ctx, nil, []resource.Key{meshA})
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(failed).To(BeEmpty())
				}
				g.Expect(revision(t, s)).To(Equal(rev + 1))
				l, err := s.List(ctx, "", "")
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(keys(l)).To(Equal([]string{"Mesh/b", "MeshTimeout/b/t"}))

				// The meshes row went too: a policy in "a" is refused again.
				_, _, err = s.Put(ctx, policy("MeshTimeout", "a", "t", `{}`))
				var moe *MissingOwnerError
				g.Expect(errors.As(err, &moe)).To(BeTrue(), "got %v", err)
			})
		})
	}
}

func TestReopen(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		s1, err := Open(ctx, dsn, "")
		g.Expect(err).NotTo(HaveOccurred())
		_, _, err = s1.Put(ctx, mesh("m"))
		g.Expect(err).NotTo(HaveOccurred())
		_, _, err = s1.Put(ctx, policy("MeshTimeout", "m", "t", `{"a":1}`))
		g.Expect(err).NotTo(HaveOccurred())
		appliedAt := migrationRows(t, s1)
		g.Expect(appliedAt).To(HaveLen(len(migrations())))
		rev := revision(t, s1)
		g.Expect(s1.Close()).To(Succeed())

		s2 := openStore(t, dsn)
		g.Expect(migrationRows(t, s2)).To(Equal(appliedAt), "re-opening runs no migration again")
		ss := s2.(*sqlStore)
		applied, err := migrate(ctx, ss.w, ss.d, migrations())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(applied).To(BeEmpty())
		l, err := s2.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m", "MeshTimeout/m/t"}))
		g.Expect(revision(t, s2)).To(Equal(rev))
	})
}

// migrationRows returns version -> applied_at.
func migrationRows(t *testing.T, s Store) map[int64]string {
	t.Helper()
	rows, err := s.(*sqlStore).r.QueryContext(context.Background(), `SELECT version, applied_at FROM schema_migrations`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var v int64
		var at string
		if err := rows.Scan(&v, &at); err != nil {
			t.Fatal(err)
		}
		out[v] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSchemaTooNew(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		s, err := Open(ctx, dsn, "")
		g.Expect(err).NotTo(HaveOccurred())
		ss := s.(*sqlStore)
		_, err = ss.w.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 'later')`)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Close()).To(Succeed())

		_, err = Open(ctx, dsn, "")
		g.Expect(err).To(MatchError(ErrSchemaTooNew))
		g.Expect(err.Error()).To(ContainSubstring("schema version 999"))
	})
}

func TestRevisionAndChanges(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		g.Expect(revision(t, s)).To(Equal(int64(0)))
		g.Expect(s.Changes()).NotTo(Receive())

		_, _, err := s.Put(ctx, mesh("m"))
		g.Expect(err).NotTo(HaveOccurred())
		_, _, err = s.Put(ctx, policy("MeshTimeout", "m", "t", `{}`))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(revision(t, s)).To(Equal(int64(2)))
		// Two writes, one pending signal: coalesced, and the writer never blocked.
		g.Expect(s.Changes()).To(Receive())
		g.Expect(s.Changes()).NotTo(Receive())

		g.Expect(s.Delete(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: "t"})).To(Succeed())
		g.Expect(revision(t, s)).To(Equal(int64(3)))
		g.Expect(s.Changes()).To(Receive())

		// Failed writes change nothing.
		g.Expect(s.Delete(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: "t"})).To(MatchError(ErrNotFound))
		_, _, err = s.Put(ctx, policy("MeshTimeout", "nope", "t", `{}`))
		g.Expect(err).To(HaveOccurred())
		g.Expect(revision(t, s)).To(Equal(int64(3)))
		g.Expect(s.Changes()).NotTo(Receive())

		// Another Store on the same database sees the revision move (replicas poll it).
		other := openStore(t, dsn)
		_, _, err = other.Put(ctx, mesh("n"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(revision(t, s)).To(Equal(int64(4)))
	})
}

func TestConcurrentPuts(t *testing.T) {
	const workers, perWorker = 8, 12
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		_, _, err := s.Put(ctx, mesh("m"))
		g.Expect(err).NotTo(HaveOccurred())
		counter := resource.Key{Kind: "MeshRateLimit", Mesh: "m", Name: "counter"}
		_, _, err = s.Put(ctx, resource.Resource{Kind: counter.Kind, Mesh: counter.Mesh, Name: counter.Name, Spec: json.RawMessage(`{"n":0}`)})
		g.Expect(err).NotTo(HaveOccurred())

		var wg sync.WaitGroup
		errs := make(chan error, workers*perWorker*3)
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					// Distinct keys.
					if _, _, err := s.Put(ctx, policy("MeshTimeout", "m", fmt.Sprintf("w%d-%d", w, i), `{}`)); err != nil {
						errs <- err
					}
					// One key, last writer wins: every write is a change.
					if _, _, err := s.Put(ctx, policy("MeshRetry", "m", "shared", fmt.Sprintf(`{"by":"w%d-%d"}`, w, i))); err != nil {
						errs <- err
					}
					// Read-modify-write with optimistic concurrency: no increment is lost.
					for {
						cur, err := s.Get(ctx, counter)
						if err != nil {
							errs <- err
							break
						}
						var spec struct{ N int }
						if err := json.Unmarshal(cur.Spec, &spec); err != nil {
							errs <- err
							break
						}
						cur.Spec = json.RawMessage(fmt.Sprintf(`{"n":%d}`, spec.N+1))
						_, _, err = s.Put(ctx, cur)
						if errors.Is(err, ErrConflict) {
							continue
						}
						if err != nil {
							errs <- err
						}
						break
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			g.Expect(err).NotTo(HaveOccurred())
		}
		l, err := s.List(ctx, "MeshTimeout", "m")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l).To(HaveLen(workers * perWorker))
		shared, err := s.Get(ctx, resource.Key{Kind: "MeshRetry", Mesh: "m", Name: "shared"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(shared.Generation).To(Equal(int64(workers * perWorker)))
		c, err := s.Get(ctx, counter)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(c.Spec)).To(Equal(fmt.Sprintf(`{"n":%d}`, workers*perWorker)))
		g.Expect(c.Generation).To(Equal(int64(workers*perWorker + 1)))
		// Every change was its own committed write: 1 mesh + 1 counter + 3 per iteration.
		g.Expect(revision(t, s)).To(Equal(int64(2 + 3*workers*perWorker)))
	})
}

func TestOpenDSN(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		dsn, dataDir string
		wantDialect  dialect
		wantPath     string
		wantErr      string // substring; "" = no error
		secret       string // must not appear in the error
	}{
		{dsn: "", dataDir: dir, wantPath: filepath.Join(dir, "kds.db")},
		{dsn: "sqlite", dataDir: dir, wantPath: filepath.Join(dir, "kds.db")},
		{dsn: "SQLite", dataDir: dir, wantPath: filepath.Join(dir, "kds.db")},
		{dsn: "sqlite:///var/lib/kds/x.db", wantPath: "/var/lib/kds/x.db"},
		{dsn: "sqlite://rel/x.db", wantPath: "rel/x.db"},
		{dsn: "/abs/store.db", wantPath: "/abs/store.db"},
		{dsn: "./store.db", wantPath: "store.db"},
		{dsn: "postgres://kds:pw@db.example:5432/kds", wantDialect: dialectPostgres},
		{dsn: "postgresql://kds@localhost/kds?sslmode=disable", wantDialect: dialectPostgres},
		{dsn: "", wantErr: "needs a data dir"},
		{dsn: "sqlite://", wantErr: "names no file"},
		{dsn: "store.db?mode=ro", wantErr: "'?' and '#' are not allowed"},
		{dsn: "mysql://root:hunter2@db/kds", wantErr: `unsupported scheme "mysql"`, secret: "hunter2"},
		{dsn: "postgres://kds:hunter2@db:notaport/kds", wantErr: "cannot parse", secret: "hunter2"},
		{dsn: "kds.sqlite", wantErr: "neither a known store nor a path ending in .db"},
	} {
		t.Run(fmt.Sprintf("%q", tc.dsn), func(t *testing.T) {
			g := NewWithT(t)
			got, err := parseDSN(tc.dsn, tc.dataDir)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ErrBadDSN))
				g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
				if tc.secret != "" {
					g.Expect(err.Error()).NotTo(ContainSubstring(tc.secret))
				}
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.dialect).To(Equal(tc.wantDialect))
			g.Expect(got.path).To(Equal(tc.wantPath))
		})
	}

	t.Run("Open creates the data dir", func(t *testing.T) {
		g := NewWithT(t)
		dataDir := filepath.Join(t.TempDir(), "a", "b")
		s, err := Open(context.Background(), "", dataDir)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Close()).To(Succeed())
		g.Expect(filepath.Join(dataDir, "kds.db")).To(BeARegularFile())
	})
	t.Run("Open reports a malformed DSN", func(t *testing.T) {
		g := NewWithT(t)
		_, err := Open(context.Background(), "redis://x", t.TempDir())
		g.Expect(err).To(MatchError(ErrBadDSN))
		g.Expect(err.Error()).To(ContainSubstring(`use "sqlite"`))
	})
	t.Run("Open reports an unreachable server", func(t *testing.T) {
		g := NewWithT(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := Open(ctx, "postgres://kds:hunter2@127.0.0.1:1/kds?connect_timeout=2", "")
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(HavePrefix("store: open postgres kds@127.0.0.1:1/kds: "))
		g.Expect(err.Error()).NotTo(ContainSubstring("hunter2"))
	})
}

func TestRebind(t *testing.T) {
	for _, tc := range []struct{ in, sqlite, pg string }{
		{"SELECT 1", "SELECT 1", "SELECT 1"},
		{"a = ? AND b = ?", "a = ? AND b = ?", "a = $1 AND b = $2"},
		{"x = '?' AND y = ?", "x = '?' AND y = ?", "x = '?' AND y = $1"},
		{`"we?rd" = ? AND z = 'it''s?' AND w = ?`, `"we?rd" = ? AND z = 'it''s?' AND w = ?`, `"we?rd" = $1 AND z = 'it''s?' AND w = $2`},
	} {
		g := NewWithT(t)
		g.Expect(dialectSQLite.rebind(tc.in)).To(Equal(tc.sqlite))
		g.Expect(dialectPostgres.rebind(tc.in)).To(Equal(tc.pg))
	}
}

func TestMeshMayNotTakeAMesh(t *testing.T) {
	g := NewWithT(t)
	s := openStore(t, filepath.Join(t.TempDir(), "kds.db"))
	_, _, err := s.Put(context.Background(), resource.Resource{Kind: resource.MeshKind, Mesh: "x", Name: "m"})
	g.Expect(err).To(MatchError(ContainSubstring("put Mesh/x/m: a Mesh takes no mesh")))
}

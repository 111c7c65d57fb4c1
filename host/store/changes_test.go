package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

func changesSince(t *testing.T, s Store, since int64) (changed []string, deleted []string, now int64) {
	t.Helper()
	rs, ks, now, err := s.ChangesSince(context.Background(), since)
	if err != nil {
		t.Fatalf("ChangesSince(%d): %v", since, err)
	}
	changed, deleted = keys(rs), []string{}
	for _, k := range ks {
		deleted = append(deleted, k.String())
	}
	return changed, deleted, now
}

func TestChangesSince(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		changed, deleted, now := changesSince(t, s, 0)
		g.Expect(changed).To(BeEmpty())
		g.Expect(deleted).To(BeEmpty())
		g.Expect(now).To(BeZero())

		for _, r := range []resource.Resource{
			mesh("a"), mesh("b"),
			policy("MeshTimeout", "a", "t", `{}`), policy("MeshRetry", "a", "r", `{}`),
			policy("MeshTimeout", "b", "t", `{}`),
		} {
			_, _, err := s.Put(ctx, r)
			g.Expect(err).NotTo(HaveOccurred())
		}
		changed, deleted, now = changesSince(t, s, 0)
		g.Expect(changed).To(Equal([]string{"Mesh/a", "Mesh/b", "MeshRetry/a/r", "MeshTimeout/a/t", "MeshTimeout/b/t"}))
		g.Expect(deleted).To(BeEmpty())
		g.Expect(now).To(Equal(int64(5)))
		changed, _, _ = changesSince(t, s, 3)
		g.Expect(changed).To(Equal([]string{"MeshRetry/a/r", "MeshTimeout/b/t"}), "the writes after revision 3 only")

		// An update carries the stored content; an unchanged write and a refused one are no
		// changes.
		stored, _, err := s.Put(ctx, policy("MeshTimeout", "a", "t", `{"x":1}`))
		g.Expect(err).NotTo(HaveOccurred())
		_, changedW, err := s.Put(ctx, policy("MeshTimeout", "b", "t", `{}`))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changedW).To(BeFalse())
		_, _, err = s.Put(ctx, policy("MeshTimeout", "missing", "t", `{}`))
		g.Expect(err).To(HaveOccurred())
		rs, ks, now, err := s.ChangesSince(ctx, 5)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(rs).To(Equal([]resource.Resource{stored}))
		g.Expect(ks).To(BeEmpty())
		g.Expect(now).To(Equal(int64(6)))

		// A delete leaves a tombstone.
		g.Expect(s.Delete(ctx, resource.Key{Kind: "MeshRetry", Mesh: "a", Name: "r"})).To(Succeed())
		changed, deleted, now = changesSince(t, s, 6)
		g.Expect(changed).To(BeEmpty())
		g.Expect(deleted).To(Equal([]string{"MeshRetry/a/r"}))
		g.Expect(now).To(Equal(int64(7)))

		// Nothing since now; a revision the store has not reached, or a negative one, cannot
		// be answered.
		changed, deleted, now = changesSince(t, s, 7)
		g.Expect(changed).To(BeEmpty())
		g.Expect(deleted).To(BeEmpty())
		g.Expect(now).To(Equal(int64(7)))
		for _, since := range []int64{8, -1} {
			_, _, _, err = s.ChangesSince(ctx, since)
			g.Expect(err).To(MatchError(ErrResync), "since %d", since)
		}

		// Created again: a change, not a delete.
		_, _, err = s.Put(ctx, policy("MeshRetry", "a", "r", `{}`))
		g.Expect(err).NotTo(HaveOccurred())
		changed, deleted, _ = changesSince(t, s, 6)
		g.Expect(changed).To(Equal([]string{"MeshRetry/a/r"}))
		g.Expect(deleted).To(BeEmpty())

		// Another Store on the same database (a replica) reads the same changes.
		other := openStore(t, dsn)
		changed, deleted, now = changesSince(t, other, 6)
		g.Expect(changed).To(Equal([]string{"MeshRetry/a/r"}))
		g.Expect(deleted).To(BeEmpty())
		g.Expect(now).To(Equal(int64(8)))
	})
}

func TestChangesSinceAfterMeshDeleteCascades(t *testing.T) {
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
					// A policy put into the Mesh in the same batch goes with it.
					failed, err := s.Apply(ctx, []resource.Resource{policy("MeshTimeout", "a", "late", `{}`)}, []resource.Key{meshA})
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(failed).To(BeEmpty())
				}
				changed, deleted, now := changesSince(t, s, rev)
				g.Expect(now).To(Equal(rev + 1))
				g.Expect(changed).To(BeEmpty())
				want := []string{"Mesh/a", "MeshRetry/a/r", "MeshTimeout/a/t"}
				if via == "Apply" {
					want = []string{"Mesh/a", "MeshRetry/a/r", "MeshTimeout/a/late", "MeshTimeout/a/t"}
				}
				g.Expect(deleted).To(Equal(want), "the cascaded deletes left tombstones too")
			})
		})
	}
}

func TestApplyRolledBackItemLeavesNoChange(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		_, _, err := s.Put(ctx, mesh("m"))
		g.Expect(err).NotTo(HaveOccurred())
		_, _, err = s.Put(ctx, policy("MeshTimeout", "m", "t", `{}`))
		g.Expect(err).NotTo(HaveOccurred())
		rev := revision(t, s)
		failed, err := s.Apply(ctx, []resource.Resource{policy("MeshTimeout", "missing", "bad", `{}`), policy("MeshRetry", "m", "ok", `{}`)},
			[]resource.Key{{Kind: "MeshTimeout", Mesh: "m", Name: "t"}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(failed).To(HaveLen(1))
		changed, deleted, now := changesSince(t, s, rev)
		g.Expect(changed).To(Equal([]string{"MeshRetry/m/ok"}))
		g.Expect(deleted).To(Equal([]string{"MeshTimeout/m/t"}))
		g.Expect(now).To(Equal(rev + 1))
	})
}

func TestChangesSinceTooOldIsResync(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		ss := s.(*sqlStore)
		ss.keep, ss.pruneEvery = 4, 2
		_, _, err := s.Put(ctx, mesh("m"))
		g.Expect(err).NotTo(HaveOccurred())
		for i := range 10 { // revisions 2..11: a put and a delete, five times
			name := fmt.Sprintf("t%d", i/2)
			if i%2 == 0 {
				_, _, err = s.Put(ctx, policy("MeshTimeout", "m", name, `{}`))
			} else {
				err = s.Delete(ctx, resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: name})
			}
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(revision(t, s)).To(Equal(int64(11)))
		// Pruned at revision 10: tombstones up to revision 6 are gone, and so is the answer
		// for anything before.
		for since := range int64(6) {
			_, _, _, err = s.ChangesSince(ctx, since)
			g.Expect(err).To(MatchError(ErrResync), "since %d", since)
		}
		_, deleted, now := changesSince(t, s, 6)
		g.Expect(deleted).To(Equal([]string{"MeshTimeout/m/t2", "MeshTimeout/m/t3", "MeshTimeout/m/t4"}))
		g.Expect(now).To(Equal(int64(11)))
		var tombstones int
		g.Expect(ss.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM tombstones`).Scan(&tombstones)).To(Succeed())
		g.Expect(tombstones).To(Equal(3), "t2 (revision 7), t3, t4")
	})
}

// rawDB opens the database dsn names without migrating it.
func rawDB(t *testing.T, dsn string) (*sql.DB, dialect) {
	t.Helper()
	tg, err := parseDSN(dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	var db *sql.DB
	if tg.dialect == dialectPostgres {
		db = stdlib.OpenDB(*tg.pgConfig)
	} else if db, err = sql.Open("sqlite", sqliteDSN(tg.path, true)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, tg.dialect
}

func TestMigrationToVersion2KeepsDataAndStartsTheHorizonAtTheRevision(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		// A database of schema version 1, written as a version-1 kds-host wrote it.
		db, d := rawDB(t, dsn)
		applied, err := migrate(ctx, db, d, migrations()[:1])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(applied).To(Equal([]int64{1}))
		for _, stmt := range []string{
			`INSERT INTO meshes (name) VALUES ('m')`,
			`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation) VALUES ('Mesh', '', 'm', 'm', '{}', '[]', '{}', 1)`,
			`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation) VALUES ('MeshTimeout', 'm', 't', 'm', '{}', '[]', '{"a":1}', 3)`,
			`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation) VALUES ('MeshRetry', 'm', 'r', 'm', '{}', '[]', '{}', 1)`,
			`UPDATE revision SET value = 7 WHERE id = 1`,
		} {
			_, err := db.ExecContext(ctx, stmt)
			g.Expect(err).NotTo(HaveOccurred(), stmt)
		}
		g.Expect(db.Close()).To(Succeed())

		s := openStore(t, dsn)
		g.Expect(migrationRows(t, s)).To(HaveLen(len(migrations())))
		l, err := s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m", "MeshRetry/m/r", "MeshTimeout/m/t"}))
		g.Expect(l[2].Generation).To(Equal(int64(3)))
		g.Expect(revision(t, s)).To(Equal(int64(7)))

		// Deletes before the migration left no tombstones: nothing before revision 7 can be
		// answered; from 7 on, everything.
		_, _, _, err = s.ChangesSince(ctx, 6)
		g.Expect(err).To(MatchError(ErrResync))
		changed, deleted, now := changesSince(t, s, 7)
		g.Expect(changed).To(BeEmpty())
		g.Expect(deleted).To(BeEmpty())
		g.Expect(now).To(Equal(int64(7)))

		// Rows from before the migration change and cascade like any other.
		_, _, err = s.Put(ctx, policy("MeshTimeout", "m", "t", `{"a":2}`))
		g.Expect(err).NotTo(HaveOccurred())
		changed, _, _ = changesSince(t, s, 7)
		g.Expect(changed).To(Equal([]string{"MeshTimeout/m/t"}))
		g.Expect(s.Delete(ctx, resource.Key{Kind: resource.MeshKind, Name: "m"})).To(Succeed())
		changed, deleted, now = changesSince(t, s, 7)
		g.Expect(changed).To(BeEmpty())
		g.Expect(deleted).To(Equal([]string{"Mesh/m", "MeshRetry/m/r", "MeshTimeout/m/t"}))
		g.Expect(now).To(Equal(int64(9)))
	})
}

// TestChangesSinceFollowsConcurrentWriters: a reader that applies ChangesSince step by step,
// while two Stores on the database write at once, ends up with what List returns. Writers
// commit in revision order, so no step misses a write that commits later with a lower revision.
func TestChangesSinceFollowsConcurrentWriters(t *testing.T) {
	const writers, writes = 4, 60
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		stores := []Store{openStore(t, dsn), openStore(t, dsn)}
		reader := openStore(t, dsn)

		view := map[resource.Key]resource.Resource{}
		var since int64
		follow := func() error {
			changed, deleted, now, err := reader.ChangesSince(ctx, since)
			if err != nil {
				return err
			}
			for _, r := range changed {
				view[r.Key()] = r
			}
			for _, k := range deleted {
				delete(view, k)
			}
			since = now
			return nil
		}

		var wg sync.WaitGroup
		errs := make(chan error, writers*writes+1)
		stop := make(chan struct{})
		followed := make(chan struct{})
		go func() {
			defer close(followed)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := follow(); err != nil {
					errs <- err
					return
				}
			}
		}()
		for w := range writers {
			wg.Go(func() {
				s := stores[w%len(stores)]
				rnd := rand.New(rand.NewPCG(uint64(w), 1))
				for i := range writes {
					m := fmt.Sprintf("m%d", rnd.IntN(2))
					var err error
					switch n := rnd.IntN(10); {
					case n == 0:
						err = s.Delete(ctx, resource.Key{Kind: resource.MeshKind, Name: m})
					case n < 3:
						_, _, err = s.Put(ctx, mesh(m))
					case n < 5:
						err = s.Delete(ctx, resource.Key{Kind: "MeshTimeout", Mesh: m, Name: fmt.Sprintf("t%d", rnd.IntN(4))})
					default:
						_, _, err = s.Put(ctx, policy("MeshTimeout", m, fmt.Sprintf("t%d", rnd.IntN(4)), fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)))
					}
					var moe *MissingOwnerError
					if err != nil && !errors.Is(err, ErrNotFound) && !errors.As(err, &moe) {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		<-followed
		close(errs)
		for err := range errs {
			g.Expect(err).NotTo(HaveOccurred())
		}
		// The reader hears the last writes by notification (PostgreSQL): ChangesSince answers as
		// of the newest revision it heard of, so follow until that is the store's.
		rev := revision(t, reader)
		g.Eventually(func() (int64, error) { err := follow(); return since, err }, 10*time.Second).Should(Equal(rev))
		l, err := reader.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		want := map[resource.Key]resource.Resource{}
		for _, r := range l {
			want[r.Key()] = r
		}
		g.Expect(view).To(Equal(want))
	})
}

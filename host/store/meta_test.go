package store

import (
	"context"
	"os"
	"testing"

	. "github.com/onsi/gomega"
)

func storeID(t *testing.T, s Store) string {
	t.Helper()
	id, err := s.ID(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestStoreID(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		s1, err := Open(ctx, dsn, "")
		g.Expect(err).NotTo(HaveOccurred())
		id := storeID(t, s1)
		g.Expect(id).To(MatchRegexp(`^[0-9a-f]{32}$`), "128 random bits, hex")
		rev := revision(t, s1)
		g.Expect(rev).To(Equal(int64(0)), "the id is schema, not a write")

		// A replica sharing the database, opened while the first is open, sees the same id.
		replica := openStore(t, dsn)
		g.Expect(storeID(t, replica)).To(Equal(id))
		g.Expect(s1.Close()).To(Succeed())

		// Reopening keeps it.
		g.Expect(storeID(t, openStore(t, dsn))).To(Equal(id))
	})
}

func TestNewStoresHaveDifferentIDs(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g := NewWithT(t)
		a := storeID(t, openStore(t, dsn))
		var other string
		if dialectOf(t, dsn) == dialectPostgres {
			other = pg.Database(t)
		} else {
			other = dsn + ".other.db"
		}
		b := storeID(t, openStore(t, other))
		g.Expect(b).NotTo(Equal(a))
	})
}

func TestTruncatedSQLiteFileIsANewStore(t *testing.T) {
	g := NewWithT(t)
	dsn := t.TempDir() + "/kds.db"
	s := openStore(t, dsn)
	_, _, err := s.Put(context.Background(), mesh("m"))
	g.Expect(err).NotTo(HaveOccurred())
	id := storeID(t, s)
	g.Expect(s.Close()).To(Succeed())

	g.Expect(os.Truncate(dsn, 0)).To(Succeed())
	s = openStore(t, dsn)
	g.Expect(storeID(t, s)).NotTo(Equal(id))
	l, err := s.List(context.Background(), "", "")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l).To(BeEmpty())
}

func dialectOf(t *testing.T, dsn string) dialect {
	t.Helper()
	tg, err := parseDSN(dsn, "")
	if err != nil {
		t.Fatal(err)
	}
	return tg.dialect
}

func TestMigratingAnOlderDatabaseGivesItAnID(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		db, d := rawDB(t, dsn)
		applied, err := migrate(ctx, db, d, migrations()[:2])
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(applied).To(Equal([]int64{1, 2}))
		_, err = db.ExecContext(ctx, `INSERT INTO meshes (name) VALUES ('m')`)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = db.ExecContext(ctx, `INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation)
			VALUES ('Mesh', '', 'm', 'm', '{}', '[]', '{}', 1)`)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(db.Close()).To(Succeed())

		s := openStore(t, dsn)
		g.Expect(migrationRows(t, s)).To(HaveKey(int64(3)))
		g.Expect(storeID(t, s)).To(MatchRegexp(`^[0-9a-f]{32}$`))
		l, err := s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(l)).To(Equal([]string{"Mesh/m"}))
	})
}

func TestMeta(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		_, ok, err := s.Meta(ctx, "global_id")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ok).To(BeFalse())

		g.Expect(s.SetMeta(ctx, "global_id", "abc")).To(Succeed())
		g.Expect(s.SetMeta(ctx, "global_id", "def")).To(Succeed())
		g.Expect(s.SetMeta(ctx, "empty", "")).To(Succeed())
		v, ok, err := s.Meta(ctx, "global_id")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(ok).To(BeTrue())
		g.Expect(v).To(Equal("def"))
		v, ok, err = s.Meta(ctx, "empty")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect([]any{v, ok}).To(Equal([]any{"", true}), "an empty value is a value")

		// Meta is not a resource write.
		g.Expect(revision(t, s)).To(Equal(int64(0)))
		g.Expect(s.Changes()).NotTo(Receive())

		// The id is the schema's, never the caller's.
		id := storeID(t, s)
		err = s.SetMeta(ctx, IDMetaKey, "mine")
		g.Expect(err).To(MatchError(ErrReservedMetaKey))
		g.Expect(err.Error()).To(ContainSubstring(`"store_id"`))
		g.Expect(s.SetMeta(ctx, "", "x")).To(MatchError(ContainSubstring("key is empty")))
		g.Expect(storeID(t, s)).To(Equal(id))
		v, ok, err = s.Meta(ctx, IDMetaKey)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect([]any{v, ok}).To(Equal([]any{id, true}))

		// Another Store on the database, and a reopened one, read what was set.
		g.Expect(s.Close()).To(Succeed())
		v, ok, err = openStore(t, dsn).Meta(ctx, "global_id")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect([]any{v, ok}).To(Equal([]any{"def", true}))
	})
}

package store

import (
	"context"
	"errors"
	"slices"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

// unreadableRows are stored values the store cannot read, each in one column of one row, as a
// restore, another version or a hand edit could leave them.
var unreadableRows = []struct {
	name, column, value string
	sqliteOnly          bool // PostgreSQL's BIGINT refuses the value itself
}{
	{name: "bad-labels", column: "labels", value: `{"team":`},
	{name: "bad-label-value", column: "labels", value: `{"team":1}`},
	{name: "bad-owners", column: "owners", value: `{"kind":"Mesh"}`},
	{name: "bad-spec", column: "spec", value: `{"default":`},
	{name: "bad-generation", column: "generation", value: `two`, sqliteOnly: true},
}

// spoil writes value into column of the rows names (MeshTimeouts of mesh default) with SQL, past
// the store, stamped with the revision the store's next write takes (so ChangesSince after the
// current revision returns them once that write commits).
func spoil(t *testing.T, dsn, column, value string, names ...string) {
	t.Helper()
	db, d := rawDB(t, dsn)
	for _, name := range names {
		if _, err := db.Exec(d.rebind(`UPDATE resources SET `+column+` = ?, revision = (SELECT value FROM revision WHERE id = 1) + 1
			WHERE kind = 'MeshTimeout' AND mesh = 'default' AND name = ?`), value, name); err != nil {
			t.Fatalf("spoil %s of %s: %v", column, name, err)
		}
	}
}

// A row with a column the store cannot read is left out of List and ChangesSince, which answer
// every other row and name it (column, generation, error); Get of it fails with the same
// *ColumnError; a write of it through the store fixes it, and a delete removes it. Before, one
// such row failed every List and ChangesSince ("stored labels: invalid character").
func TestARowWithAColumnTheStoreCannotReadIsLeftOutAndNamed(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx, s := NewWithT(t), context.Background(), openStore(t, dsn)
		postgres := dialectOf(t, dsn) == dialectPostgres
		_, _, err := s.Put(ctx, mesh("default"))
		g.Expect(err).NotTo(HaveOccurred())
		want := map[resource.Key]string{} // the column named, by row
		for _, u := range unreadableRows {
			if !u.sqliteOnly || !postgres {
				want[resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: u.name}] = u.column
			}
		}
		for _, name := range append([]string{"good-1"}, keyNames(want)...) {
			_, _, err := s.Put(ctx, policy("MeshTimeout", "default", name, `{"default":{"connectionTimeout":"1s"}}`))
			g.Expect(err).NotTo(HaveOccurred())
		}
		before := revision(t, s)
		for _, u := range unreadableRows {
			if !u.sqliteOnly || !postgres {
				spoil(t, dsn, u.column, u.value, u.name)
			}
		}
		_, _, err = s.Put(ctx, policy("MeshTimeout", "default", "good-2", `{}`)) // commits the spoiled rows' revision
		g.Expect(err).NotTo(HaveOccurred())

		named := func(rows []*ColumnError) map[resource.Key]string {
			out := map[resource.Key]string{}
			for _, r := range rows {
				g.Expect(r.Err).To(HaveOccurred())
				g.Expect(r.Error()).To(ContainSubstring(r.Key.String() + ": stored " + r.Column + " cannot be read: "))
				wantGen := int64(1)
				if r.Column == "generation" {
					wantGen = 0
				}
				g.Expect(r.Generation).To(Equal(wantGen), "%s", r.Key)
				out[r.Key] = r.Column
			}
			return out
		}

		all, err := s.List(ctx, "", "")
		bad, other := Unreadable(err)
		g.Expect(other).NotTo(HaveOccurred())
		g.Expect(err.Error()).To(HavePrefix(`list all kinds in mesh "": `))
		g.Expect(keys(all)).To(Equal([]string{"Mesh/default", "MeshTimeout/default/good-1", "MeshTimeout/default/good-2"}))
		g.Expect(named(bad)).To(Equal(want))
		g.Expect(slices.IsSortedFunc(bad, func(a, b *ColumnError) int { return compareKeys(a.Key, b.Key) })).To(BeTrue(), "sorted by key")

		changed, deleted, now, err := s.ChangesSince(ctx, before)
		bad, other = Unreadable(err)
		g.Expect(other).NotTo(HaveOccurred())
		g.Expect(keys(changed)).To(Equal([]string{"MeshTimeout/default/good-2"}))
		g.Expect(deleted).To(BeEmpty())
		g.Expect(now).To(Equal(before + 1))
		g.Expect(named(bad)).To(Equal(want))

		for key, column := range want {
			_, err := s.Get(ctx, key)
			var ce *ColumnError
			g.Expect(err).To(MatchError(ContainSubstring("get "+key.String()+": ")), "%s", key)
			g.Expect(errors.As(err, &ce)).To(BeTrue(), "%v", err)
			g.Expect(ce.Column).To(Equal(column))
		}

		// Written again through the store: fixed. A row whose generation cannot be read is not
		// (no generation to bump): it is deleted.
		fixed := []string{"Mesh/default", "MeshTimeout/default/good-1", "MeshTimeout/default/good-2"}
		for key, column := range want {
			r := policy("MeshTimeout", "default", key.Name, `{"default":{"connectionTimeout":"2s"}}`)
			stored, result, err := s.Write(ctx, r, nil)
			if column == "generation" {
				var ce *ColumnError
				g.Expect(errors.As(err, &ce)).To(BeTrue(), "%v", err)
				g.Expect(ce.Column).To(Equal("generation"))
				g.Expect(s.Delete(ctx, key)).To(Succeed())
				continue
			}
			g.Expect(err).NotTo(HaveOccurred(), "%s", key)
			g.Expect(result).To(Equal(Updated))
			g.Expect(stored.Generation).To(Equal(int64(2)))
			fixed = append(fixed, key.String())
		}
		all, err = s.List(ctx, "", "")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(keys(all)).To(ConsistOf(fixed))
	})
}

// The change log of a PostgreSQL store answers as its query does: a row it carries that cannot
// be read ({"team":1} is compact JSON, so a write's payload carries it) is left out and named.
func TestTheChangeLogLeavesOutARowItCannotRead(t *testing.T) {
	g := NewWithT(t)
	var l changeLog
	l.record(&logEntry{rev: 1, changed: []row{
		{gen: 1, key: resource.Key{Kind: "Mesh", Name: "m"}, labels: `{}`, owners: `[]`, spec: `{}`},
		{gen: 4, key: resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: "t"}, labels: `{"team":1}`, owners: `[]`, spec: `{}`},
	}})
	changed, _, now, ok, err := l.changesSince(0, 1)
	g.Expect(ok).To(BeTrue())
	g.Expect(now).To(Equal(int64(1)))
	g.Expect(keys(changed)).To(Equal([]string{"Mesh/m"}))
	bad, other := Unreadable(err)
	g.Expect(other).NotTo(HaveOccurred())
	g.Expect(bad).To(HaveExactElements(And(
		HaveField("Key", resource.Key{Kind: "MeshTimeout", Mesh: "m", Name: "t"}),
		HaveField("Column", "labels"), HaveField("Generation", int64(4)))))
}

func keyNames(m map[resource.Key]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k.Name)
	}
	return out
}

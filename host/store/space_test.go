package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

// big is a policy whose spec needs pages the database does not have once it is full.
func big(name string) resource.Resource {
	return policy("MeshTimeout", "m", name, fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 256<<10)))
}

// A SQLite database that cannot grow (max_page_count reached, as a full disk) fails every write
// that needs room with ErrNoSpace, a batch whole (before: "no such savepoint", as SQLite had
// rolled the transaction back already), and says so until a write or the probe succeeds; reads
// go on, and once it can grow again the next write succeeds and everything written before is
// there, after a reopen too.
func TestAFullSQLiteDatabaseRefusesWritesWithErrNoSpaceAndRecovers(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	path := filepath.Join(t.TempDir(), "kds.db")
	s := openStore(t, path)
	sw := s.(SpaceWatcher)
	g.Expect(s.Put(ctx, mesh("m"))).Error().NotTo(HaveOccurred())
	var acked []string
	for i := range 20 {
		r := policy("MeshTimeout", "m", fmt.Sprintf("t%02d", i), `{}`)
		_, _, err := s.Put(ctx, r)
		g.Expect(err).NotTo(HaveOccurred())
		acked = append(acked, r.Key().String())
	}
	g.Expect(LimitPages(ctx, s, 1)).To(BeNumerically(">", 1), "at least the pages it has")

	_, _, err := s.Put(ctx, big("a"))
	g.Expect(err).To(MatchError(ErrNoSpace))
	g.Expect(err).To(MatchError(ContainSubstring("put MeshTimeout/m/a")))
	g.Expect(sw.OutOfSpace()).To(BeTrue())

	_, err = s.WriteBatch(ctx, []WriteItem{{Resource: policy("MeshRetry", "m", "small", `{}`)}, {Resource: big("b")}})
	g.Expect(err).To(MatchError(ErrNoSpace), "the batch fails whole")
	g.Expect(err).NotTo(MatchError(ContainSubstring("savepoint")))
	_, err = s.Apply(ctx, []resource.Resource{policy("MeshRetry", "m", "small", `{}`), big("c")}, nil)
	g.Expect(err).To(MatchError(ErrNoSpace))
	g.Expect(err).NotTo(MatchError(ContainSubstring("savepoint")))
	g.Expect(sw.ProbeSpace(ctx)).To(MatchError(ErrNoSpace))
	g.Expect(sw.OutOfSpace()).To(BeTrue())

	l, err := s.List(ctx, "", "")
	g.Expect(err).NotTo(HaveOccurred(), "reads go on")
	g.Expect(keys(l)).To(HaveLen(len(acked)+1), "nothing of the failed batches is stored")

	g.Expect(LimitPages(ctx, s, 1<<30)).To(Equal(int64(1 << 30)))
	g.Expect(sw.OutOfSpace()).To(BeTrue(), "until a write or the probe succeeds")
	g.Expect(sw.ProbeSpace(ctx)).To(Succeed())
	g.Expect(sw.OutOfSpace()).To(BeFalse())
	_, _, err = s.Put(ctx, big("a"))
	g.Expect(err).NotTo(HaveOccurred())

	// A write that commits clears it too.
	g.Expect(LimitPages(ctx, s, 1)).Error().NotTo(HaveOccurred())
	_, _, err = s.Put(ctx, big("d"))
	g.Expect(err).To(MatchError(ErrNoSpace))
	g.Expect(LimitPages(ctx, s, 1<<30)).Error().NotTo(HaveOccurred())
	_, _, err = s.Put(ctx, big("d"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sw.OutOfSpace()).To(BeFalse())

	g.Expect(s.Close()).To(Succeed())
	s = openStore(t, path)
	l, err = s.List(ctx, "MeshTimeout", "m")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(keys(l)).To(Equal(append([]string{"MeshTimeout/m/a", "MeshTimeout/m/d"}, acked...)), "every acknowledged write")
}

// The dialects read a lack of space, and a lack of other resources, from the database's own
// errors: SQLITE_FULL, PostgreSQL SQLSTATE 53100, ENOSPC; SQLSTATE class 53's others.
func TestTheDialectsTellALackOfSpaceFromOtherErrors(t *testing.T) {
	pgErr := func(code string) error {
		return fmt.Errorf("put x: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "could not extend file"})
	}
	for _, tc := range []struct {
		name           string
		d              dialect
		err            error
		noSpace, short bool
	}{
		{"postgres disk_full", dialectPostgres, pgErr("53100"), true, false},
		{"postgres out_of_memory", dialectPostgres, pgErr("53200"), false, true},
		{"postgres too_many_connections", dialectPostgres, pgErr("53300"), false, true},
		{"postgres configuration_limit_exceeded", dialectPostgres, pgErr("53400"), false, true},
		{"postgres foreign key", dialectPostgres, pgErr("23503"), false, false},
		{"ENOSPC", dialectSQLite, fmt.Errorf("write: %w", syscall.ENOSPC), true, false},
		{"another error", dialectSQLite, errors.New("database is locked"), false, false},
		{"nil", dialectSQLite, nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(tc.d.isNoSpace(tc.err)).To(Equal(tc.noSpace))
			g.Expect(tc.d.isShortOfResources(tc.err)).To(Equal(tc.short))
			s := &sqlStore{d: tc.d}
			err := s.classified(tc.err)
			g.Expect(errors.Is(err, ErrNoSpace)).To(Equal(tc.noSpace))
			g.Expect(errors.Is(err, ErrInsufficientResources)).To(Equal(tc.short))
			g.Expect(s.OutOfSpace()).To(Equal(tc.noSpace))
			if tc.err != nil {
				g.Expect(err).To(MatchError(tc.err), "the database's own error stays in the chain")
			}
		})
	}
}

// A real PostgreSQL error of class 53 (configuration_limit_exceeded, from temp_file_limit) is
// read as a lack of resources, not of space. (A real disk_full needs a full disk under the
// server; its SQLSTATE is covered above.)
func TestAPostgreSQLResourceLimitIsInsufficientResources(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	db, err := sql.Open("pgx", pg.Database(t))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = db.Close() })
	conn, err := db.Conn(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	for _, q := range []string{`SET work_mem = '64kB'`, `SET temp_file_limit = '64kB'`} {
		_, err := conn.ExecContext(ctx, q)
		g.Expect(err).NotTo(HaveOccurred())
	}
	_, err = conn.ExecContext(ctx, `SELECT g FROM generate_series(1, 200000) g ORDER BY g DESC`)
	var pe *pgconn.PgError
	g.Expect(errors.As(err, &pe)).To(BeTrue(), "%v", err)
	g.Expect(pe.Code).To(Equal("53400"))
	g.Expect(dialectPostgres.isShortOfResources(err)).To(BeTrue())
	g.Expect(dialectPostgres.isNoSpace(err)).To(BeFalse())
}

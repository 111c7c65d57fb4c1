package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/store/pgtest"
)

func TestStart(t *testing.T) {
	g := NewWithT(t)
	dsn := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)

	var version, addr string
	g.Expect(conn.QueryRow(ctx, `SHOW server_version`).Scan(&version)).To(Succeed())
	g.Expect(conn.QueryRow(ctx, `SELECT inet_server_addr()::text`).Scan(&addr)).To(Succeed())
	t.Logf("PostgreSQL %s on %s", version, addr)
	g.Expect(addr).To(HavePrefix("127.0.0.1"))
	if pgtestExternal() {
		return
	}
	var listen string
	g.Expect(conn.QueryRow(ctx, `SHOW listen_addresses`).Scan(&listen)).To(Succeed())
	g.Expect(listen).To(Equal("127.0.0.1"))
}

func TestSharedHandsOutFreshDatabases(t *testing.T) {
	g := NewWithT(t)
	var sh pgtest.Shared
	// Registered first, so it runs after the cleanups that drop the databases.
	t.Cleanup(func() { g.Expect(sh.Stop()).To(Succeed()) })
	a, b := sh.Database(t), sh.Database(t)
	g.Expect(a).NotTo(Equal(b))
	ctx := context.Background()
	for _, dsn := range []string{a, b} {
		conn, err := pgx.Connect(ctx, dsn)
		g.Expect(err).NotTo(HaveOccurred())
		var n int
		g.Expect(conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&n)).To(Succeed())
		g.Expect(n).To(BeZero())
		_, err = conn.Exec(ctx, `CREATE TABLE t (x int)`)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(conn.Close(ctx)).To(Succeed())
	}
}

func pgtestExternal() bool { return pgtest.Skipped() || testingEnv(pgtest.EnvDSN) != "" }

// A server started with more settings runs with them (the replicas bench preloads
// pg_stat_statements this way).
func TestStartServerWithSettings(t *testing.T) {
	if pgtestExternal() {
		t.Skip("an external server's settings are its own, or PostgreSQL tests are skipped")
	}
	g := NewWithT(t)
	ctx := context.Background()
	s, err := pgtest.StartServerWith(ctx, "work_mem=7MB", "shared_preload_libraries=pg_stat_statements")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(s.Stop()).To(Succeed()) })
	conn, err := pgx.Connect(ctx, s.Database(t))
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	var workMem, preload string
	g.Expect(conn.QueryRow(ctx, `SHOW work_mem`).Scan(&workMem)).To(Succeed())
	g.Expect(conn.QueryRow(ctx, `SHOW shared_preload_libraries`).Scan(&preload)).To(Succeed())
	g.Expect(workMem).To(Equal("7MB"))
	g.Expect(preload).To(Equal("pg_stat_statements"))
}

// A frozen server keeps its connections and answers none of their queries, nor new connections,
// until it is thawed; then both go on.
func TestAFrozenServerAnswersNothingUntilThawed(t *testing.T) {
	if pgtestExternal() {
		t.Skip("an external server is not frozen")
	}
	g := NewWithT(t)
	srv, err := pgtest.StartServer(context.Background())
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(srv.Stop()).To(Succeed()) })
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.AdminDSN())
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)

	g.Expect(srv.Freeze()).To(Succeed())
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	var one int
	err = conn.QueryRow(short, `SELECT 1`).Scan(&one)
	cancel()
	g.Expect(err).To(HaveOccurred(), "a query on an open connection waits")
	short, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pgx.Connect(short, srv.AdminDSN())
	cancel()
	g.Expect(err).To(HaveOccurred(), "a new connection waits")

	g.Expect(srv.Thaw()).To(Succeed())
	g.Eventually(func() error {
		c, err := pgx.Connect(ctx, srv.AdminDSN())
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		return c.QueryRow(ctx, `SELECT 1`).Scan(&one)
	}, 30*time.Second, 100*time.Millisecond).Should(Succeed())
}

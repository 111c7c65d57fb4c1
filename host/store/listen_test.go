package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

// TestListenHearsOtherWriters: a PostgreSQL store's Changes fires for another store's writes to
// the same database, by LISTEN; with its LISTEN connection killed (pg_terminate_backend) and
// reconnecting refused, by polling; and by LISTEN again once it reconnects. ChangesSince then
// returns every write, so nothing is lost whichever way the signal came.
func TestListenHearsOtherWriters(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	dsn := pg.Database(t)
	a := openStore(t, dsn).(*sqlStore)
	tgt, err := parseDSN(dsn, "")
	g.Expect(err).NotTo(HaveOccurred())
	var refuse atomic.Bool
	opts := defaultListenOptions()
	opts.backoffMin, opts.backoffMax, opts.poll = 10*time.Millisecond, 40*time.Millisecond, 20*time.Millisecond
	opts.connect = func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("refused by the test")
		}
		return pgx.ConnectConfig(ctx, cfg)
	}
	b, err := openPostgresWith(ctx, tgt.pgConfig, opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { b.Close() })
	status := func() ListenStatus { return b.ListenStatus() }
	g.Eventually(status, 10*time.Second).Should(HaveField("Listening", true))
	g.Expect(status().Enabled).To(BeTrue())
	drain(b)

	put := func(name string) {
		t.Helper()
		_, _, err := a.Put(ctx, policy("MeshTimeout", "m", name, `{}`))
		g.Expect(err).NotTo(HaveOccurred())
	}
	_, _, err = a.Put(ctx, mesh("m"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(b.Changes(), 10*time.Second).Should(Receive(), "heard by LISTEN")
	g.Eventually(status, 10*time.Second).Should(And(HaveField("Notified", int64(1)), HaveField("Polls", int64(0))))
	since := revision(t, b)

	// The LISTEN connection dies and cannot come back: the store polls.
	refuse.Store(true)
	b.listen.mu.Lock()
	pid := b.listen.pid
	b.listen.mu.Unlock()
	var killed bool
	g.Expect(a.w.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, int64(pid)).Scan(&killed)).To(Succeed())
	g.Expect(killed).To(BeTrue())
	g.Eventually(status, 10*time.Second).Should(HaveField("Listening", false))
	drain(b)
	for i := range 3 {
		put(fmt.Sprintf("while-polling-%d", i))
	}
	g.Eventually(b.Changes(), 10*time.Second).Should(Receive(), "heard by polling")
	g.Eventually(func() int64 { return status().Polled }, 10*time.Second).Should(BeNumerically(">=", 1))
	g.Expect(status().Notified).To(Equal(int64(1)), "no notification while the connection is down")
	g.Expect(status().LastError).NotTo(BeEmpty())
	changed, _, now := changesSince(t, b, since)
	g.Expect(changed).To(Equal([]string{"MeshTimeout/m/while-polling-0", "MeshTimeout/m/while-polling-1", "MeshTimeout/m/while-polling-2"}))

	// It reconnects and listens again.
	refuse.Store(false)
	g.Eventually(status, 10*time.Second).Should(And(HaveField("Listening", true), HaveField("Connects", int64(2))))
	polled := status().Polled
	drain(b)
	put("after-reconnect")
	g.Eventually(b.Changes(), 10*time.Second).Should(Receive(), "heard by LISTEN again")
	g.Eventually(func() int64 { return status().Notified }, 10*time.Second).Should(Equal(int64(2)))
	g.Expect(status().Polled).To(Equal(polled), "no polling while listening")
	changed, _, _ = changesSince(t, b, now)
	g.Expect(changed).To(Equal([]string{"MeshTimeout/m/after-reconnect"}))
}

// TestSignalsSkipWhatWasSignalled: a store's own write signals Changes when it commits; a
// notification or poll of a revision already signalled (its own write's NOTIFY, arriving after)
// signals nothing more, a newer one does, and one whose revision is not known always does.
func TestSignalsSkipWhatWasSignalled(t *testing.T) {
	g, ctx := NewWithT(t), context.Background()
	s := openStore(t, pg.Database(t)).(*sqlStore)
	g.Eventually(s.ListenStatus, 10*time.Second).Should(HaveField("Listening", true))
	_, _, err := s.Put(ctx, mesh("m"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.Changes()).To(Receive(), "signalled at commit")
	g.Eventually(s.ListenStatus, 10*time.Second).Should(HaveField("Notified", BeNumerically("<=", 1)),
		"its own NOTIFY signals at most once more, when it overtakes the commit's return")
	drain(s)
	g.Expect(s.signal(1)).To(BeFalse())
	g.Expect(s.Changes()).NotTo(Receive())
	g.Expect(s.signal(2)).To(BeTrue())
	g.Expect(s.Changes()).To(Receive())
	g.Expect(s.signal(2)).To(BeFalse())
	g.Expect(s.signal(-1)).To(BeTrue(), "a payload that is not a revision")
}

// TestSQLiteDoesNotListen: SQLite has no LISTEN; its Changes hears its own writes.
func TestSQLiteDoesNotListen(t *testing.T) {
	g := NewWithT(t)
	s := openStore(t, t.TempDir()+"/kds.db")
	g.Expect(s.(Listener).ListenStatus()).To(Equal(ListenStatus{}))
	_, _, err := s.Put(context.Background(), resource.Resource{Kind: resource.MeshKind, Name: "m"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.Changes()).To(Receive())
}

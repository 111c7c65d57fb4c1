package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChangesChannel is the PostgreSQL channel every write NOTIFYs in its transaction, with the
// revision it committed as the payload, and what it changed when that is small (changelog.go).
const ChangesChannel = "kds_changes"

// ListenApplicationName is the application_name of a store's LISTEN connection, as
// pg_stat_activity shows it.
const ListenApplicationName = "kds-host listen"

// ListenStatus is how a store hears writes made by other processes sharing its database: over a
// PostgreSQL LISTEN connection, or, while that is down, by polling the revision.
type ListenStatus struct {
	// Enabled: the store listens (PostgreSQL). A SQLite store hears its own writes only.
	Enabled bool `json:"enabled"`
	// Listening: the LISTEN connection is up.
	Listening bool `json:"listening"`
	// Connects counts the LISTEN connections made.
	Connects int64 `json:"connects"`
	// Notified counts the Changes signals sent for other writers' notifications.
	Notified int64 `json:"notified"`
	// Polls counts the revision reads made while not listening; Polled counts the Changes
	// signals they sent.
	Polls  int64 `json:"polls"`
	Polled int64 `json:"polled"`
	// LastError is why the LISTEN connection last went down or failed to come up.
	LastError string `json:"lastError,omitempty"`
	// ChangesFromLog counts the ChangesSince answered from the changes notifications carried
	// (and the store's own writes), ChangesQueried those that read the database.
	ChangesFromLog int64 `json:"changesFromLog"`
	ChangesQueried int64 `json:"changesQueried"`
}

// Listener is a Store that hears other processes' writes; every Store Open returns is one.
type Listener interface {
	ListenStatus() ListenStatus
}

// listenOptions tune the listener; tests shorten them.
type listenOptions struct {
	// backoffMin and backoffMax bound the wait between LISTEN connection attempts.
	backoffMin, backoffMax time.Duration
	// poll is how often the revision is read while the LISTEN connection is down.
	poll time.Duration
	// idle is how long a wait for a notification lasts before the connection is pinged.
	idle time.Duration
	// timeout bounds each network call: connect, LISTEN, ping, close, a revision read.
	timeout time.Duration
	// connect opens the LISTEN connection (tests wrap it).
	connect func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error)
}

func defaultListenOptions() listenOptions {
	return listenOptions{
		backoffMin: 100 * time.Millisecond, backoffMax: 5 * time.Second,
		poll: 250 * time.Millisecond, idle: 30 * time.Second, timeout: 5 * time.Second,
		connect: pgx.ConnectConfig,
	}
}

// listener keeps a LISTEN connection to the database and signals the store's Changes for every
// notification of a revision the store has not signalled yet. While the connection is down it
// reconnects with jittered exponential backoff and reads the revision every poll interval
// instead, signalling when it moved; once up again it signals once more, so the store's reader
// catches up (ChangesSince) with whatever was committed between the last poll and the LISTEN.
type listener struct {
	cfg    *pgx.ConnConfig
	opts   listenOptions
	store  *sqlStore
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	status ListenStatus
	pid    uint32 // the LISTEN connection's backend, while it is up
}

func startListener(cfg *pgx.ConnConfig, opts listenOptions, s *sqlStore) *listener {
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = ListenApplicationName
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{cfg: cfg, opts: opts, store: s, cancel: cancel, done: make(chan struct{}), status: ListenStatus{Enabled: true}}
	go l.run(ctx)
	return l
}

// stop ends the listener and waits for its goroutine, which closes the connection.
func (l *listener) stop() {
	l.cancel()
	<-l.done
}

func (l *listener) Status() ListenStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status
}

func (l *listener) update(f func(s *ListenStatus)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.status)
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := l.opts.backoffMin
	for {
		conn, err := l.connect(ctx)
		if err == nil {
			// Whatever committed before the LISTEN took effect was notified to nobody here;
			// from Listening on, every write is heard by its notification.
			l.poll(ctx, false)
			l.mu.Lock()
			l.status.Listening, l.pid = true, conn.PgConn().PID()
			l.status.Connects++
			l.mu.Unlock()
			backoff = l.opts.backoffMin
			err = l.wait(ctx, conn)
			cctx, cancel := context.WithTimeout(context.Background(), l.opts.timeout)
			_ = conn.Close(cctx)
			cancel()
		}
		l.mu.Lock()
		l.status.Listening, l.pid = false, 0
		if ctx.Err() == nil {
			l.status.LastError = err.Error()
		}
		l.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		// Poll until the next attempt.
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, l.opts.backoffMax)
		next := time.NewTimer(wait)
		tick := time.NewTicker(l.opts.poll)
		l.poll(ctx, true)
	polling:
		for {
			select {
			case <-ctx.Done():
				next.Stop()
				tick.Stop()
				return
			case <-tick.C:
				l.poll(ctx, true)
			case <-next.C:
				break polling
			}
		}
		tick.Stop()
	}
}

// connect opens the LISTEN connection, within the timeout.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	defer cancel()
	conn, err := l.opts.connect(cctx, l.cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{ChangesChannel}.Sanitize()); err != nil {
		_ = conn.Close(cctx)
		return nil, fmt.Errorf("listen: %w", err)
	}
	return conn, nil
}

// wait signals Changes for each notification until the connection fails or ctx ends. A wait
// that hears nothing for the idle time pings the server, so a connection that died silently is
// noticed, and reads the revision, so a write whose notification was lost is too.
func (l *listener) wait(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, l.opts.idle)
		n, err := conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && timedOut:
			pctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			// And read the revision: the reader answers from the notifications' changes, so
			// this is what would notice a write whose notification never came.
			l.poll(ctx, false)
			continue
		case err != nil:
			return fmt.Errorf("wait for notifications: %w", err)
		}
		rev := l.store.heard(n.Payload)
		if rev < 0 {
			// Not ours to parse: signal anyway, the reader finds out. Its revision is not
			// known, so read it: the reader must then query past what the log holds, not take
			// the log's newest for the database's.
			l.poll(ctx, false)
		}
		if l.store.signal(rev) {
			l.update(func(s *ListenStatus) { s.Notified++ })
		}
	}
}

// poll reads the revision and signals Changes when it is past what the store signalled.
// counted polls are those made while not listening.
func (l *listener) poll(ctx context.Context, counted bool) {
	pctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	rev, err := l.store.Revision(pctx)
	cancel()
	if counted {
		l.update(func(s *ListenStatus) { s.Polls++ })
	}
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			l.update(func(s *ListenStatus) { s.LastError = "poll: " + err.Error() })
		}
		return
	}
	if l.store.signal(rev) && counted {
		l.update(func(s *ListenStatus) { s.Polled++ })
	}
}

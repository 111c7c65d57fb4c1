package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
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
	// Listening: other processes' writes are heard at once, by this store's LISTEN or from the
	// changes relay's hub.
	Listening bool `json:"listening"`
	// Relay is this store's part in the replicas' changes relay (Relay): RelayHub (it listens
	// for the replicas that follow it), RelayFollower (it hears writes from the hub at Hub), or
	// "" (it listens for itself, or polls).
	Relay string `json:"relay,omitempty"`
	Hub   string `json:"hub,omitempty"`
	// Connects counts the connections made for listening (the first, then one after each loss).
	Connects int64 `json:"connects"`
	// Notified counts the Changes signals sent for other writers' notifications.
	Notified int64 `json:"notified"`
	// Polls counts the revision reads made while not listening; Polled counts the Changes
	// signals any revision read sent (those polls, and the read made each time writes are heard
	// again, for what committed while they were not).
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

// The parts a store plays in the changes relay (ListenStatus.Relay).
const (
	RelayHub      = "hub"
	RelayFollower = "follower"
)

// Relay passes the notifications of writes between the replicas that share a PostgreSQL store,
// so that PostgreSQL wakes one LISTEN backend per write, not one per replica. The replica that
// holds the database's relay lock, the hub, listens, records its Address in relay_hub, and
// Publishes every notification it hears; the others Follow it. A replica that cannot follow the
// hub listens itself until it can: a relay that fails costs PostgreSQL what no relay does, and
// loses no write (each follower reads the revision once it is followed, as a new LISTEN does).
type Relay interface {
	// ID names this replica; Address is where the other replicas reach its relay.
	ID() string
	Address() string
	// Lead starts this replica's term as the hub: followers are taken on until Resign, which
	// ends their streams. Publish passes a payload to every follower, without waiting for any.
	Lead()
	Publish(payload string)
	Resign()
	// Follow follows the hub at address until ctx ends or the stream fails. It calls ready once
	// the hub has taken this follower on (every later write reaches it), then heard with each
	// payload the hub passes on, in order, on one goroutine.
	Follow(ctx context.Context, address string, ready func(), heard func(payload string)) error
}

// Relayer is a Store that can share its LISTEN with other replicas (PostgreSQL). SetRelay takes
// effect at once: the listener drops its connection, which releases the relay lock if it held
// it, and connects again with r (nil: listen alone).
type Relayer interface {
	SetRelay(r Relay)
}

// relayLock is the PostgreSQL advisory lock (one 64-bit key) that the hub holds on its LISTEN
// connection: "kdsrelay" in ASCII.
const relayLock int64 = 0x6b647372656c6179

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

	mu     sync.Mutex // guards status, pid, relay and kick
	status ListenStatus
	pid    uint32             // the LISTEN connection's backend, while it is up
	relay  Relay              // SetRelay's; read at each connection
	kick   context.CancelFunc // ends the current connection's work, for a new relay

	// publish is the relay's Publish while this store is the hub; owned by run's goroutine.
	publish func(payload string)
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
		kicked := false
		if err == nil {
			backoff = l.opts.backoffMin
			cctx, kick := context.WithCancel(ctx)
			l.mu.Lock()
			relay := l.relay
			l.kick = kick
			l.status.Connects++
			l.mu.Unlock()
			err = l.serve(cctx, conn, relay)
			kicked = cctx.Err() != nil && ctx.Err() == nil
			kick()
			cctx, cancel := context.WithTimeout(context.Background(), l.opts.timeout)
			_ = conn.Close(cctx)
			cancel()
		}
		l.mu.Lock()
		l.status.Listening, l.status.Relay, l.status.Hub, l.pid, l.kick = false, "", "", 0, nil
		if ctx.Err() == nil && !kicked {
			l.status.LastError = err.Error()
		}
		l.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if kicked {
			continue // a new relay: connect again at once
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

// connect opens the listener's connection, within the timeout.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	defer cancel()
	conn, err := l.opts.connect(cctx, l.cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// serve hears other processes' writes over conn until it fails or ctx ends: by LISTEN alone
// without a relay; with one, as the hub when it takes the relay lock, as a follower of the hub
// when it does not, and by LISTEN while it has no hub to follow, trying again with backoff.
func (l *listener) serve(ctx context.Context, conn *pgx.Conn, relay Relay) error {
	if relay == nil {
		return l.listen(ctx, conn, time.Time{}, nil)
	}
	retry := l.opts.backoffMin
	for {
		lead, hub, err := l.elect(ctx, conn, relay)
		if err != nil {
			return err
		}
		if lead {
			// Followers are taken on once the LISTEN is in effect: each reads the revision once
			// taken on, and every later write is heard here and passed on.
			l.update(func(s *ListenStatus) { s.Relay = RelayHub })
			l.publish = relay.Publish
			err := l.listen(ctx, conn, time.Time{}, relay.Lead)
			relay.Resign()
			l.publish = nil
			return err
		}
		if hub != "" {
			followed, err := l.follow(ctx, relay, hub)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			l.update(func(s *ListenStatus) { s.LastError = fmt.Sprintf("follow the changes relay's hub at %s: %v", hub, err) })
			if followed {
				// It was the hub: it is gone or resigned, and the next may be elected already.
				retry = l.opts.backoffMin
				continue
			}
		}
		// No hub to follow: listen here until the next try.
		wait := retry/2 + rand.N(retry/2+1)
		retry = min(2*retry, l.opts.backoffMax)
		if err := l.listen(ctx, conn, time.Now().Add(wait), nil); err != nil {
			return err
		}
	}
}

// elect takes the relay lock on conn when it is free, and then records this replica as the
// hub; lead reports it did. Otherwise hub is where relay_hub says the hub is ("" when it says
// nothing, or names this replica: a record of its own past term).
func (l *listener) elect(ctx context.Context, conn *pgx.Conn, relay Relay) (lead bool, hub string, err error) {
	tctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	defer cancel()
	if err := conn.QueryRow(tctx, `SELECT pg_try_advisory_lock($1)`, relayLock).Scan(&lead); err != nil {
		return false, "", fmt.Errorf("take the relay lock: %w", err)
	}
	if lead {
		if _, err := conn.Exec(tctx, `INSERT INTO relay_hub (id, replica, address) VALUES (1, $1, $2)
			ON CONFLICT (id) DO UPDATE SET replica = excluded.replica, address = excluded.address`, relay.ID(), relay.Address()); err != nil {
			return false, "", fmt.Errorf("record the relay's hub: %w", err)
		}
		return true, relay.Address(), nil
	}
	err = conn.QueryRow(tctx, `SELECT address FROM relay_hub WHERE id = 1`).Scan(&hub)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, "", nil
	case err != nil:
		return false, "", fmt.Errorf("read the relay's hub: %w", err)
	case hub == relay.Address():
		return false, "", nil
	}
	return false, hub, nil
}

// follow follows the hub at hub until the stream ends; followed reports that the hub took this
// store on. Once it has, the store reads the revision: whatever committed before was relayed to
// nobody here.
func (l *listener) follow(ctx context.Context, relay Relay, hub string) (followed bool, err error) {
	err = relay.Follow(ctx, hub, func() {
		followed = true
		l.poll(ctx, false)
		l.update(func(s *ListenStatus) { s.Listening, s.Relay, s.Hub = true, RelayFollower, hub })
	}, func(payload string) { l.hear(ctx, payload) })
	l.update(func(s *ListenStatus) { s.Listening, s.Relay, s.Hub = false, "", "" })
	return followed, err
}

// listen LISTENs on conn, calls listening (when not nil) once the LISTEN is in effect, and
// signals Changes for every notification until conn fails, ctx ends, or until passes (zero:
// never), when it UNLISTENs and returns nil.
func (l *listener) listen(ctx context.Context, conn *pgx.Conn, until time.Time, listening func()) error {
	channel := pgx.Identifier{ChangesChannel}.Sanitize()
	tctx, cancel := context.WithTimeout(ctx, l.opts.timeout)
	_, err := conn.Exec(tctx, "LISTEN "+channel)
	cancel()
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if listening != nil {
		listening()
	}
	// Whatever committed before the LISTEN took effect was notified to nobody here; from
	// Listening on, every write is heard by its notification.
	l.poll(ctx, false)
	l.mu.Lock()
	l.status.Listening, l.pid = true, conn.PgConn().PID()
	l.mu.Unlock()
	err = l.wait(ctx, conn, until)
	l.mu.Lock()
	l.status.Listening, l.pid = false, 0
	l.mu.Unlock()
	if err != nil {
		return err
	}
	tctx, cancel = context.WithTimeout(ctx, l.opts.timeout)
	defer cancel()
	if _, err := conn.Exec(tctx, "UNLISTEN "+channel); err != nil {
		return fmt.Errorf("unlisten: %w", err)
	}
	return nil
}

// wait signals Changes for each notification until the connection fails, ctx ends or until
// passes (zero: never; nil then). A wait that hears nothing for the idle time pings the server,
// so a connection that died silently is noticed, and reads the revision, so a write whose
// notification was lost is too. As the hub, it passes each notification on before it takes it.
func (l *listener) wait(ctx context.Context, conn *pgx.Conn, until time.Time) error {
	for {
		d := l.opts.idle
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				return nil
			}
			d = min(d, left)
		}
		wctx, cancel := context.WithTimeout(ctx, d)
		n, err := conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && timedOut:
			if !until.IsZero() && time.Until(until) <= 0 {
				continue // the loop's first check returns
			}
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
		if l.publish != nil {
			l.publish(n.Payload)
		}
		l.hear(ctx, n.Payload)
	}
}

// hear takes a notification's payload: it records what the write changed and signals Changes.
func (l *listener) hear(ctx context.Context, payload string) {
	rev := l.store.heard(payload)
	if rev < 0 {
		// Not ours to parse: signal anyway, the reader finds out. Its revision is not known,
		// so read it: the reader must then query past what the log holds, not take the log's
		// newest for the database's.
		l.poll(ctx, false)
	}
	if l.store.signal(rev) {
		l.update(func(s *ListenStatus) { s.Notified++ })
	}
}

// poll reads the revision and signals Changes when it is past what the store signalled (counted
// in Polled). counted polls are those made while not listening.
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
	if !l.store.signal(rev) {
		return
	}
	l.update(func(s *ListenStatus) { s.Polled++ })
	if l.publish != nil {
		// A revision the hub did not hear of: its followers did not either.
		l.publish(strconv.FormatInt(rev, 10))
	}
}

// setRelay makes the listener use r from its next connection on, and ends the current one.
func (l *listener) setRelay(r Relay) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.relay = r
	if l.kick != nil {
		l.kick()
	}
}

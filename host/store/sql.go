package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kds-host/kds-host/host/resource"
)

// sqlStore is the Store over database/sql, for both dialects. Writes go through w (one
// connection for SQLite), reads through r (the same pool for PostgreSQL).
type sqlStore struct {
	d       dialect
	w, r    *sql.DB
	changes chan struct{}
	// seen is the newest revision Changes was signalled for (own commits, notifications, polls):
	// the newest the log may answer up to.
	seen atomic.Int64
	// listen hears other processes' writes (PostgreSQL); nil for SQLite.
	listen *listener
	// log holds the changes of recent revisions, so that ChangesSince need not query for them
	// (PostgreSQL); nil for SQLite. fromLog and queried count ChangesSince's answers by source.
	log              *changeLog
	fromLog, queried atomic.Int64
	// Tombstones are kept for the last keep revisions, pruned every pruneEvery revisions.
	keep, pruneEvery int64
	// noSpace is set by a write that failed for lack of space, cleared by one that commits and
	// by a successful ProbeSpace (see SpaceWatcher).
	noSpace atomic.Bool
	// observer is told how long each operation took (observe.go).
	observer operationObserver
}

func newSQLStore(d dialect, w, r *sql.DB) *sqlStore {
	return &sqlStore{d: d, w: w, r: r, changes: make(chan struct{}, 1), keep: tombstoneRevisions, pruneEvery: pruneEvery}
}

// tombstoneRevisions is how many revisions back ChangesSince can answer from: the tombstones of
// older deletes are pruned (every pruneEvery revisions), and a reader further behind than that
// gets ErrResync and lists everything.
const (
	tombstoneRevisions = 10000
	pruneEvery         = 100
)

// row is a resource in its stored form: labels and owners as canonical JSON, the spec as
// canonical JSON, and the foreign key to the meshes table. A row read from the database is read
// column by column (rowColumns): unread is its first column that cannot be read.
type row struct {
	key                   resource.Key
	meshRef               sql.NullString
	labels, owners, spec  string
	gen                   int64 // read only: writes take the generation from the resource
	createdMS, modifiedMS int64 // read only: the store stamps them
	unread                *ColumnError
}

func (s *sqlStore) Changes() <-chan struct{} { return s.changes }

func (s *sqlStore) ID(ctx context.Context) (string, error) {
	id, ok, err := s.Meta(ctx, IDMetaKey)
	switch {
	case err != nil:
		return "", fmt.Errorf("store id: %w", err)
	case !ok || id == "":
		return "", fmt.Errorf("store id: the %s database holds none (no %q row in store_meta)", s.d, IDMetaKey)
	}
	return id, nil
}

func (s *sqlStore) Meta(ctx context.Context, key string) (_ string, _ bool, err error) {
	defer s.timed(opMeta, time.Now(), &err)
	var v string
	err = s.r.QueryRowContext(ctx, s.d.rebind(`SELECT value FROM store_meta WHERE key = ?`), key).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("meta %q: %w", key, err)
	}
	return v, true, nil
}

func (s *sqlStore) SetMeta(ctx context.Context, key, value string) (err error) {
	defer s.timed(opSetMeta, time.Now(), &err)
	switch key {
	case IDMetaKey:
		return fmt.Errorf("set meta %q: %w", key, ErrReservedMetaKey)
	case "":
		return errors.New("set meta: the key is empty")
	}
	if _, err := s.w.ExecContext(ctx, s.d.rebind(`INSERT INTO store_meta (key, value) VALUES (?, ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`), key, value); err != nil {
		return fmt.Errorf("set meta %q: %w", key, s.classified(err))
	}
	return nil
}

// SetRelay implements Relayer for a PostgreSQL store; a SQLite store has no listener to share.
func (s *sqlStore) SetRelay(r Relay) {
	if s.listen != nil {
		s.listen.setRelay(r)
	}
}

// Close stops the listener and closes the database connections. Changes is not closed.
func (s *sqlStore) Close() error {
	if s.listen != nil {
		s.listen.stop()
	}
	err := s.w.Close()
	if s.r != s.w {
		err = errors.Join(err, s.r.Close())
	}
	return err
}

// advance records that Changes is signalled for rev (and so for every revision before it).
func (s *sqlStore) advance(rev int64) {
	for {
		seen := s.seen.Load()
		if rev <= seen || s.seen.CompareAndSwap(seen, rev) {
			return
		}
	}
}

// signal signals Changes for rev unless it was signalled for rev or a later revision already
// (revisions commit in order, so a reader woken for a later one sees rev too); a negative rev
// (not known) always signals. It reports whether it signalled.
func (s *sqlStore) signal(rev int64) bool {
	if rev >= 0 {
		for {
			seen := s.seen.Load()
			if rev <= seen {
				return false
			}
			if s.seen.CompareAndSwap(seen, rev) {
				break
			}
		}
	}
	s.notify()
	return true
}

// ListenStatus says how the store hears other processes' writes, and how ChangesSince answered.
func (s *sqlStore) ListenStatus() ListenStatus {
	if s.listen == nil {
		return ListenStatus{}
	}
	st := s.listen.Status()
	st.ChangesFromLog, st.ChangesQueried = s.fromLog.Load(), s.queried.Load()
	return st
}

// heard takes in a notification's payload: the changes it carries go to the log. It returns the
// revision, or -1 when the payload is not one this store reads.
func (s *sqlStore) heard(p string) int64 {
	rev, entry, err := parsePayload(p)
	if err != nil {
		return -1
	}
	if entry != nil && s.log != nil {
		s.log.record(entry)
	}
	return rev
}

// notify signals Changes without blocking: a pending signal already covers this write.
func (s *sqlStore) notify() {
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

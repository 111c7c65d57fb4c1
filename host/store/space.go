package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNoSpace: the database has no room to write (its disk is full, or it reached a size
	// limit). Reads still work; writes succeed again once space is freed, with nothing
	// committed before lost.
	ErrNoSpace = errors.New("no space left to write the database")
	// ErrInsufficientResources: the database is short of memory or connections for now
	// (PostgreSQL's SQLSTATE class 53 other than disk_full, SQLite's SQLITE_NOMEM); retry later.
	ErrInsufficientResources = errors.New("the database is short of resources")
)

// SpaceWatcher is a Store that knows when its writes fail for lack of space; every Store Open
// returns is one.
type SpaceWatcher interface {
	// OutOfSpace reports whether a write failed with ErrNoSpace and no resource write or
	// ProbeSpace has succeeded since.
	OutOfSpace() bool
	// ProbeSpace writes a row of SpaceProbeBytes and removes it, in one transaction that
	// commits. It fails with ErrNoSpace while there is no room for it, and clears OutOfSpace
	// when it succeeds.
	ProbeSpace(ctx context.Context) error
}

// SpaceProbeBytes is the size of the row ProbeSpace writes: room for a resource of common size.
const SpaceProbeBytes = 64 << 10

// spaceProbeKey is the store_meta key ProbeSpace writes and removes.
const spaceProbeKey = "space_probe"

// OutOfSpace implements SpaceWatcher.
func (s *sqlStore) OutOfSpace() bool { return s.noSpace.Load() }

// ProbeSpace implements SpaceWatcher. The row's value is random, so PostgreSQL cannot compress
// it to nothing.
func (s *sqlStore) ProbeSpace(ctx context.Context) (err error) {
	defer s.timed(opSpaceProbe, time.Now(), &err)
	b := make([]byte, SpaceProbeBytes/2)
	_, _ = rand.Read(b)
	err = s.probeSpace(ctx, hex.EncodeToString(b))
	if err != nil {
		return s.classified(fmt.Errorf("space probe: %w", err))
	}
	s.noSpace.Store(false)
	return nil
}

func (s *sqlStore) probeSpace(ctx context.Context, value string) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: does nothing
	if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO store_meta (key, value) VALUES (?, ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`), spaceProbeKey, value); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM store_meta WHERE key = ?`), spaceProbeKey); err != nil {
		return err
	}
	return tx.Commit()
}

// classified is err of a write, wrapped with ErrNoSpace or ErrInsufficientResources when the
// database says so; a write that fails for lack of space sets OutOfSpace.
func (s *sqlStore) classified(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNoSpace):
		s.noSpace.Store(true)
		return err
	case errors.Is(err, ErrInsufficientResources):
		return err
	case s.d.isNoSpace(err):
		s.noSpace.Store(true)
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	case s.d.isShortOfResources(err):
		return fmt.Errorf("%w: %w", ErrInsufficientResources, err)
	}
	return err
}

// wholeTxError is err, classified, when it ends the whole transaction rather than one item of
// it: the database has no space (SQLite has rolled the transaction back already; on PostgreSQL
// the items after it would fail alike) or is short of resources. It is nil for an error of the
// item alone.
func (s *sqlStore) wholeTxError(err error) error {
	err = s.classified(err)
	if errors.Is(err, ErrNoSpace) || errors.Is(err, ErrInsufficientResources) {
		return err
	}
	return nil
}

// rollbackError is the error of an item whose savepoint could not be rolled back because the
// database ended the transaction: the item's own error, which says why, and the rollback's.
func rollbackError(err, rerr error) error {
	return fmt.Errorf("%w (and the transaction is gone: rollback to savepoint: %v)", err, rerr)
}

// LimitPages sets SQLite's max_page_count on the writer connection of st, a SQLite store from
// Open: writes that need the database to grow past pages fail as on a full disk. It is how a
// test fills a database without filling a disk; a limit below the database's size is taken as
// its size. It returns the limit in force.
func LimitPages(ctx context.Context, st Store, pages int64) (int64, error) {
	s, ok := st.(*sqlStore)
	if !ok || s.d != dialectSQLite {
		return 0, errors.New("limit pages: not a SQLite store from Open")
	}
	var limit int64
	if err := s.w.QueryRowContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)).Scan(&limit); err != nil {
		return 0, fmt.Errorf("limit pages: %w", err)
	}
	return limit, nil
}

package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kds-host/kds-host/host/resource"
)

func (s *sqlStore) Get(ctx context.Context, key resource.Key) (_ resource.Resource, err error) {
	defer s.timed(opGet, time.Now(), &err)
	q := s.d.rebind(`SELECT ` + selectColumns + ` FROM resources WHERE kind = ? AND mesh = ? AND name = ?`)
	w, err := scanRow(s.r.QueryRowContext(ctx, q, key.Kind, key.Mesh, key.Name))
	if errors.Is(err, sql.ErrNoRows) {
		return resource.Resource{}, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	if err != nil {
		return resource.Resource{}, fmt.Errorf("get %s: %w", key, err)
	}
	r, err := w.decode() // a *ColumnError when it cannot be read
	if err != nil {
		return resource.Resource{}, fmt.Errorf("get %s: %w", key, err)
	}
	return r, nil
}

func (s *sqlStore) List(ctx context.Context, kind, mesh string) (_ []resource.Resource, err error) {
	defer s.timed(opList, time.Now(), &err)
	var where []string
	var args []any
	if kind != "" {
		where, args = append(where, "kind = ?"), append(args, kind)
	}
	if mesh != "" {
		where, args = append(where, "mesh = ?"), append(args, mesh)
	}
	q := `SELECT ` + selectColumns + ` FROM resources`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	rows, err := s.r.QueryContext(ctx, s.d.rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("list %s in mesh %q: %w", kindOrAll(kind), mesh, err)
	}
	defer rows.Close()
	var out []resource.Resource
	var bad []*ColumnError
	for rows.Next() {
		w, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("list %s in mesh %q: %w", kindOrAll(kind), mesh, err)
		}
		r, err := w.decode()
		if err != nil {
			bad = append(bad, err.(*ColumnError))
			continue
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list %s in mesh %q: %w", kindOrAll(kind), mesh, err)
	}
	// Sorted here rather than by ORDER BY: PostgreSQL orders text by the database's collation,
	// SQLite by bytes; callers get byte order from both.
	slices.SortFunc(out, func(a, b resource.Resource) int { return compareKeys(a.Key(), b.Key()) })
	if err := unreadable(bad); err != nil {
		return out, fmt.Errorf("list %s in mesh %q: %w", kindOrAll(kind), mesh, err)
	}
	return out, nil
}

func kindOrAll(kind string) string {
	if kind == "" {
		return "all kinds"
	}
	return kind
}

func (s *sqlStore) Revision(ctx context.Context) (_ int64, err error) {
	defer s.timed(opRevision, time.Now(), &err)
	var v int64
	if err := s.r.QueryRowContext(ctx, `SELECT value FROM revision WHERE id = 1`).Scan(&v); err != nil {
		return 0, fmt.Errorf("revision: %w", err)
	}
	return v, nil
}

func (s *sqlStore) ChangesSince(ctx context.Context, since int64) (changed []resource.Resource, deleted []resource.Key, now int64, err error) {
	defer s.timed(opChangesSince, time.Now(), &err)
	if s.log != nil {
		// As of the newest revision this store heard of: a newer one is signalled when its
		// notification (or a poll) comes, and the reader asks again.
		var ok bool
		changed, deleted, now, ok, err = s.log.changesSince(since, s.seen.Load())
		if ok {
			s.fromLog.Add(1)
			return changesAnswer(since, changed, deleted, now, err)
		}
		s.queried.Add(1)
	}
	changed, deleted, now, err = s.changesSince(ctx, since)
	return changesAnswer(since, changed, deleted, now, err)
}

// changesAnswer is ChangesSince's answer: what it read, with an *UnreadableError for the rows
// it left out, or nothing and the error.
func changesAnswer(since int64, changed []resource.Resource, deleted []resource.Key, now int64, err error) ([]resource.Resource, []resource.Key, int64, error) {
	if err == nil {
		return changed, deleted, now, nil
	}
	err = fmt.Errorf("changes since revision %d: %w", since, err)
	if _, other := Unreadable(err); other != nil {
		return nil, nil, 0, err
	}
	return changed, deleted, now, err
}

// changesSince reads the revision, the changed rows and the tombstones in one read-only
// transaction, so they are one consistent view: with PostgreSQL a REPEATABLE READ snapshot, with
// SQLite a WAL read transaction.
func (s *sqlStore) changesSince(ctx context.Context, since int64) (changed []resource.Resource, deleted []resource.Key, now int64, err error) {
	opts := &sql.TxOptions{ReadOnly: true}
	if s.d == dialectPostgres {
		opts.Isolation = sql.LevelRepeatableRead
	}
	tx, err := s.r.BeginTx(ctx, opts)
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() { _ = tx.Rollback() }() // read-only: nothing to commit

	var horizon int64
	if err := tx.QueryRowContext(ctx, `SELECT value, horizon FROM revision WHERE id = 1`).Scan(&now, &horizon); err != nil {
		return nil, nil, 0, err
	}
	switch {
	case since < horizon:
		return nil, nil, 0, errBeforeHorizon(horizon)
	case since > now:
		return nil, nil, 0, fmt.Errorf("%w (the store is at revision %d)", ErrResync, now)
	case since == now:
		return nil, nil, now, nil
	}

	rows, err := s.revisionRows(ctx, tx, ">", since, 0)
	if err != nil {
		return nil, nil, 0, err
	}
	var bad []*ColumnError
	for i := range rows {
		r, err := rows[i].decode()
		if err != nil {
			bad = append(bad, err.(*ColumnError))
			continue
		}
		changed = append(changed, r)
	}
	slices.SortFunc(changed, func(a, b resource.Resource) int { return compareKeys(a.Key(), b.Key()) })
	if deleted, err = s.revisionDeletes(ctx, tx, ">", since, 0); err != nil {
		return nil, nil, 0, err
	}
	slices.SortFunc(deleted, compareKeys)
	return changed, deleted, now, unreadable(bad)
}

// revisionRows reads the resource rows whose revision is op rev (op: ">" or "="), at most limit
// of them (0: all).
func (s *sqlStore) revisionRows(ctx context.Context, tx *sql.Tx, op string, rev int64, limit int) ([]row, error) {
	rows, err := s.queryRevision(ctx, tx, `SELECT `+selectColumns+` FROM resources WHERE revision `+op+` ?`, rev, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		w, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// revisionDeletes reads the keys deleted at revisions op rev (op: ">" or "=") that are still
// absent (a key deleted and created again is a row, not a delete), at most limit of them (0:
// all).
func (s *sqlStore) revisionDeletes(ctx context.Context, tx *sql.Tx, op string, rev int64, limit int) ([]resource.Key, error) {
	rows, err := s.queryRevision(ctx, tx, `SELECT t.kind, t.mesh, t.name FROM tombstones t
		WHERE t.revision `+op+` ? AND NOT EXISTS (
			SELECT 1 FROM resources r WHERE r.kind = t.kind AND r.mesh = t.mesh AND r.name = t.name)`, rev, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []resource.Key
	for rows.Next() {
		var k resource.Key
		if err := rows.Scan(&k.Kind, &k.Mesh, &k.Name); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// queryRevision runs q, whose one parameter is a revision, with at most limit rows (0: all).
func (s *sqlStore) queryRevision(ctx context.Context, tx *sql.Tx, q string, rev int64, limit int) (*sql.Rows, error) {
	if limit > 0 {
		return tx.QueryContext(ctx, s.d.rebind(q+` LIMIT ?`), rev, limit)
	}
	return tx.QueryContext(ctx, s.d.rebind(q), rev)
}

// errBeforeHorizon is ChangesSince's refusal of a revision older than the horizon.
func errBeforeHorizon(horizon int64) error {
	return fmt.Errorf("%w (the store keeps changes after revision %d)", ErrResync, horizon)
}

// compareKeys orders keys by (kind, mesh, name), bytewise.
func compareKeys(a, b resource.Key) int {
	return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.Mesh, b.Mesh), strings.Compare(a.Name, b.Name))
}

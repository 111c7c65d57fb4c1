package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kds-host/kds-host/host/resource"
)

// putAttempts bounds Put's retries when a concurrent writer creates the row between Put's read
// and its insert. Writers queue on the revision row (see write), so this is a guard only.
const putAttempts = 10

// savepoint is the name of the savepoint each Apply item runs in.
const savepoint = "kds_apply_item"

func encodeRow(r *resource.Resource) (row, error) {
	out := row{key: r.Key()}
	switch {
	case r.Kind == resource.MeshKind:
		if r.Mesh != "" {
			return row{}, fmt.Errorf("a %s takes no mesh (got %q)", resource.MeshKind, r.Mesh)
		}
		out.meshRef = sql.NullString{String: r.Name, Valid: true}
	case r.Mesh != "":
		out.meshRef = sql.NullString{String: r.Mesh, Valid: true}
	}
	if r.Kind == "" || r.Name == "" {
		return row{}, errors.New("kind and name are required")
	}
	labels := r.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	b, err := json.Marshal(labels) // encoding/json sorts map keys: canonical
	if err != nil {
		return row{}, fmt.Errorf("labels: %w", err)
	}
	out.labels = string(b)
	owners := r.Owners
	if owners == nil {
		owners = []resource.Key{}
	}
	if b, err = json.Marshal(owners); err != nil {
		return row{}, fmt.Errorf("owners: %w", err)
	}
	out.owners = string(b)
	if out.spec, err = canonicalJSON(r.Spec); err != nil {
		return row{}, fmt.Errorf("spec: %w", err)
	}
	return out, nil
}

// canonicalJSON re-encodes a JSON value compactly with sorted object keys, numbers kept as
// written; an absent or null spec is "{}".
func canonicalJSON(raw json.RawMessage) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return "{}", nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("trailing data after the JSON value")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func (w row) sameContent(o row) bool {
	return w.labels == o.labels && w.owners == o.owners && w.spec == o.spec
}

// missingOwner maps the database's foreign-key refusal to *MissingOwnerError.
func (s *sqlStore) missingOwner(key resource.Key, err error) error {
	if !s.d.isForeignKeyViolation(err) {
		return err
	}
	mesh := key.Mesh
	if mesh == "" {
		mesh = key.Name // a Mesh row refers to itself
	}
	return &MissingOwnerError{Key: key, Owner: resource.Key{Kind: resource.MeshKind, Name: mesh}}
}

// putError gives a failed put of key its context; a *MissingOwnerError of key names it already.
func (s *sqlStore) putError(key resource.Key, err error) error {
	err = s.missingOwner(key, err)
	if moe, ok := err.(*MissingOwnerError); ok && moe.Key == key {
		return moe
	}
	return fmt.Errorf("put %s: %w", key, err)
}

// errRetry: a concurrent writer changed the row between read and write; run Put again.
var errRetry = errors.New("row changed concurrently")

func (s *sqlStore) Put(ctx context.Context, r resource.Resource) (resource.Resource, bool, error) {
	stored, result, err := s.Write(ctx, r, nil)
	return stored, result != Unchanged, err
}

func (s *sqlStore) Write(ctx context.Context, r resource.Resource, onCreate []resource.Resource) (_ resource.Resource, _ Result, err error) {
	defer s.timed(opWrite, time.Now(), &err)
	key := r.Key()
	w, err := encodeRow(&r)
	if err != nil {
		return resource.Resource{}, Unchanged, fmt.Errorf("put %s: %w", key, err)
	}
	with := make([]row, len(onCreate))
	for i := range onCreate {
		if with[i], err = encodeRow(&onCreate[i]); err != nil {
			return resource.Resource{}, Unchanged, fmt.Errorf("put %s: %s, to be created with it: %w", key, onCreate[i].Key(), err)
		}
	}
	for attempt := 1; ; attempt++ {
		stored, result, err := s.putOnce(ctx, w, r.Generation, with)
		if errors.Is(err, errRetry) && attempt < putAttempts {
			continue
		}
		if err != nil {
			return resource.Resource{}, Unchanged, s.putError(key, err)
		}
		return stored, result, nil
	}
}

// putOnce is one attempt of Write in one transaction.
func (s *sqlStore) putOnce(ctx context.Context, w row, wantGen int64, with []row) (stored resource.Resource, result Result, err error) {
	_, err = s.write(ctx, func(tx *sql.Tx, rev int64) (bool, error) {
		var changed bool
		stored, result, changed, err = s.writeRowTx(ctx, tx, w, wantGen, with, rev)
		return changed, err
	})
	if err != nil {
		return resource.Resource{}, Unchanged, err
	}
	return stored, result, nil
}

// writeRowTx is Write of one row inside tx, at revision rev; changed is false when the row was
// stored exactly so already.
func (s *sqlStore) writeRowTx(ctx context.Context, tx *sql.Tx, w row, wantGen int64, with []row, rev int64) (stored resource.Resource, result Result, changed bool, err error) {
	k := w.key
	q := `SELECT ` + selectColumns + ` FROM resources WHERE kind = ? AND mesh = ? AND name = ?`
	if s.d == dialectPostgres {
		// Lock the row until commit so concurrent Puts of one key queue instead of
		// retrying (SQLite has one writer; its transactions are serial already).
		q += ` FOR UPDATE`
	}
	old, err := scanRow(tx.QueryRowContext(ctx, s.d.rebind(q), k.Kind, k.Mesh, k.Name))
	found, oldGen := err == nil, old.gen
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return stored, Unchanged, false, err
	}
	switch {
	case found && old.unread != nil && old.unread.Column == "generation":
		return stored, Unchanged, false, old.unread // no generation to compare or bump: delete it
	case !found && wantGen != 0:
		return stored, Unchanged, false, fmt.Errorf("%w: generation %d given, but no resource is stored", ErrConflict, wantGen)
	case found && wantGen != 0 && wantGen != oldGen:
		return stored, Unchanged, false, fmt.Errorf("%w: generation %d given, %d stored", ErrConflict, wantGen, oldGen)
	case found && old.unread == nil && old.sameContent(w):
		stored, err = old.decode()
		return stored, Unchanged, false, err
	}
	// A row with a column that cannot be read is written whole: the write fixes it.
	var n int64
	gen := int64(1)
	now := time.Now().UnixMilli()
	w.createdMS, w.modifiedMS = now, now
	if !found {
		result = Created
		n, err = s.insertTx(ctx, tx, w, gen, rev, now)
	} else {
		result, gen = Updated, oldGen+1
		w.createdMS = old.createdMS
		n, err = rowsAffected(tx.ExecContext(ctx, s.d.rebind(`UPDATE resources SET labels = ?, owners = ?, spec = ?, generation = ?, revision = ?, created_ms = ?, modified_ms = ?
			WHERE kind = ? AND mesh = ? AND name = ? AND generation = ?`),
			w.labels, w.owners, w.spec, gen, rev, w.createdMS, now, k.Kind, k.Mesh, k.Name, oldGen))
	}
	if err != nil {
		return stored, Unchanged, false, err
	}
	if n == 0 {
		if wantGen != 0 {
			return stored, Unchanged, false, fmt.Errorf("%w: generation %d given, changed concurrently", ErrConflict, wantGen)
		}
		return stored, Unchanged, false, errRetry
	}
	if !found {
		// Created here, so the resources that come with it are created here too, once.
		for _, c := range with {
			if _, err := s.insertTx(ctx, tx, c, 1, rev, now); err != nil {
				return stored, Unchanged, false, fmt.Errorf("%s, created with it: %w", c.key, s.missingOwner(c.key, err))
			}
		}
	}
	w.gen = gen
	stored, err = w.decode()
	return stored, result, true, err
}

// WriteBatch writes items in one transaction, each as Write would and in its own SAVEPOINT: an
// item the database refuses is rolled back and reported in its outcome, the rest commit. The
// revision is bumped, and Changes signalled, once.
func (s *sqlStore) WriteBatch(ctx context.Context, items []WriteItem) (_ []WriteOutcome, err error) {
	defer s.timed(opWriteBatch, time.Now(), &err)
	out := make([]WriteOutcome, len(items))
	type encoded struct {
		w    row
		with []row
		err  error
	}
	enc := make([]encoded, len(items))
	for i := range items {
		it := &items[i]
		w, err := encodeRow(&it.Resource)
		if err != nil {
			enc[i].err = fmt.Errorf("put %s: %w", it.Resource.Key(), err)
			continue
		}
		enc[i].w = w
		for j := range it.OnCreate {
			c, err := encodeRow(&it.OnCreate[j])
			if err != nil {
				enc[i].err = fmt.Errorf("put %s: %s, to be created with it: %w", it.Resource.Key(), it.OnCreate[j].Key(), err)
				break
			}
			enc[i].with = append(enc[i].with, c)
		}
	}
	_, err = s.write(ctx, func(tx *sql.Tx, rev int64) (bool, error) {
		changed := false
		for i := range items {
			if enc[i].err != nil {
				out[i] = WriteOutcome{Err: enc[i].err}
				continue
			}
			for attempt := 1; ; attempt++ {
				if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
					return false, fmt.Errorf("savepoint: %w", err)
				}
				stored, result, ok, err := s.writeRowTx(ctx, tx, enc[i].w, items[i].Resource.Generation, enc[i].with, rev)
				if err != nil {
					if ctx.Err() != nil {
						return false, ctx.Err()
					}
					if err := s.wholeTxError(err); err != nil {
						return false, fmt.Errorf("put %s: %w", items[i].Resource.Key(), err)
					}
					if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); rerr != nil {
						return false, rollbackError(err, rerr)
					}
					if errors.Is(err, errRetry) && attempt < putAttempts {
						continue // a concurrent create of the key committed meanwhile
					}
					out[i] = WriteOutcome{Err: s.putError(items[i].Resource.Key(), err)}
				} else {
					out[i] = WriteOutcome{Stored: stored, Result: result}
					changed = changed || ok
				}
				if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
					return false, fmt.Errorf("release savepoint: %w", err)
				}
				break
			}
		}
		return changed, nil
	})
	if err != nil {
		return nil, fmt.Errorf("write %d resources: %w", len(items), err)
	}
	return out, nil
}

// insertTx creates the row w at generation gen and revision rev, with the meshes row of a
// Mesh, and returns 1, or 0 when a resource with its key is stored already (and is left alone).
func (s *sqlStore) insertTx(ctx context.Context, tx execer, w row, gen, rev, now int64) (int64, error) {
	if err := s.meshRowTx(ctx, tx, w.key); err != nil {
		return 0, err
	}
	k := w.key
	return rowsAffected(tx.ExecContext(ctx, s.d.rebind(`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation, revision, created_ms, modified_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (kind, mesh, name) DO NOTHING`),
		k.Kind, k.Mesh, k.Name, w.meshRef, w.labels, w.owners, w.spec, gen, rev, now, now))
}

// meshRowTx makes sure a Mesh's row in the meshes table exists, for the Mesh row to refer to;
// it does nothing for other kinds.
func (s *sqlStore) meshRowTx(ctx context.Context, tx execer, key resource.Key) error {
	if key.Kind != resource.MeshKind {
		return nil
	}
	_, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO meshes (name) VALUES (?) ON CONFLICT DO NOTHING`), key.Name)
	return err
}

// rowsAffected is the count of rows an Exec changed, or its error.
func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *sqlStore) Delete(ctx context.Context, key resource.Key) (err error) {
	defer s.timed(opDelete, time.Now(), &err)
	_, err = s.write(ctx, func(tx *sql.Tx, _ int64) (bool, error) {
		n, err := s.deleteTx(ctx, tx, key)
		if err == nil && n == 0 {
			err = ErrNotFound
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// deleteTx deletes one resource and returns how many rows it removed (0 or 1). Deleting a Mesh
// also deletes its meshes row, and ON DELETE CASCADE removes the resources in it. The
// resources_tombstone trigger records every row removed, cascades included.
func (s *sqlStore) deleteTx(ctx context.Context, tx execer, key resource.Key) (int64, error) {
	res, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM resources WHERE kind = ? AND mesh = ? AND name = ?`), key.Kind, key.Mesh, key.Name)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if key.Kind == resource.MeshKind && key.Mesh == "" {
		if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM meshes WHERE name = ?`), key.Name); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Apply writes the batch in one transaction, in this order: puts of Meshes, the other puts,
// deletes of non-Mesh resources, deletes of Meshes (each group in the order given). So a
// policy may arrive with its Mesh in one batch, and a Mesh deleted in the batch takes the
// resources in it, including any put earlier in the same batch. Every item runs in its own
// SAVEPOINT: an item the database refuses is rolled back to it and reported in failed (a
// *MissingOwnerError when its Mesh is missing), and the rest commit. Puts are written verbatim,
// generation included; deleting an absent key is not a failure. The revision is bumped and
// Changes signalled once, when anything changed.
func (s *sqlStore) Apply(ctx context.Context, puts []resource.Resource, deletes []resource.Key) (_ map[resource.Key]error, err error) {
	defer s.timed(opApply, time.Now(), &err)
	type item struct {
		put *resource.Resource
		del resource.Key
	}
	items := make([]item, 0, len(puts)+len(deletes))
	for _, mesh := range []bool{true, false} {
		for i := range puts {
			if (puts[i].Kind == resource.MeshKind) == mesh {
				items = append(items, item{put: &puts[i]})
			}
		}
	}
	for _, mesh := range []bool{false, true} {
		for _, k := range deletes {
			if (k.Kind == resource.MeshKind) == mesh {
				items = append(items, item{del: k})
			}
		}
	}
	var failed map[resource.Key]error
	_, err = s.write(ctx, func(tx *sql.Tx, rev int64) (bool, error) {
		ex := &stmtCache{tx: tx}
		defer ex.close()
		changed := false
		for _, it := range items {
			if _, err := ex.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
				return false, fmt.Errorf("savepoint: %w", err)
			}
			var key resource.Key
			var n int64
			var err error
			if it.put != nil {
				key = it.put.Key()
				if n, err = s.upsertTx(ctx, ex, it.put, rev); err != nil {
					err = s.putError(key, err)
				}
			} else {
				key = it.del
				if n, err = s.deleteTx(ctx, ex, key); err != nil {
					err = fmt.Errorf("delete %s: %w", key, err)
				}
			}
			if err != nil {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				if err := s.wholeTxError(err); err != nil {
					return false, err
				}
				if _, rerr := ex.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); rerr != nil {
					return false, rollbackError(err, rerr)
				}
				if failed == nil {
					failed = map[resource.Key]error{}
				}
				failed[key] = err
			} else {
				changed = changed || n > 0
			}
			if _, err := ex.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
				return false, fmt.Errorf("release savepoint: %w", err)
			}
		}
		return changed, nil
	})
	if err != nil {
		return nil, fmt.Errorf("apply %d puts, %d deletes: %w", len(puts), len(deletes), err)
	}
	return failed, nil
}

// upsertTx writes r verbatim, at revision rev, and returns 1 when the row was created or
// changed, 0 when it was already stored exactly so (and keeps its revision).
func (s *sqlStore) upsertTx(ctx context.Context, tx execer, r *resource.Resource, rev int64) (int64, error) {
	w, err := encodeRow(r)
	if err != nil {
		return 0, err
	}
	if err := s.meshRowTx(ctx, tx, w.key); err != nil {
		return 0, err
	}
	now := time.Now().UnixMilli()
	return rowsAffected(tx.ExecContext(ctx, s.d.rebind(`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation, revision, created_ms, modified_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, mesh, name) DO UPDATE SET
			labels = excluded.labels, owners = excluded.owners, spec = excluded.spec, generation = excluded.generation,
			revision = excluded.revision, modified_ms = excluded.modified_ms
		WHERE resources.labels <> excluded.labels OR resources.owners <> excluded.owners
			OR resources.spec <> excluded.spec OR resources.generation <> excluded.generation`),
		r.Kind, r.Mesh, r.Name, w.meshRef, w.labels, w.owners, w.spec, r.Generation, rev, now, now))
}

// write runs fn in a write transaction at the next revision, rev. When fn reports a change, the
// transaction commits and Changes is signalled; otherwise it is rolled back, and the revision
// with it. The revision is bumped first: every writer locks its row before anything else (one
// lock order, no deadlock), so in PostgreSQL writers queue on it until the holder commits, and
// revisions commit in order. A reader that sees revision R therefore sees every write up to R
// and none after, and fn can stamp its rows (and the tombstone trigger its tombstones) with
// rev.
//
// On PostgreSQL the NOTIFY carries what the revision changed when that is small (see
// changelog.go), read back in the transaction, and the store logs it before Changes is
// signalled, so neither its reader nor the other replicas' query for it.
//
// A write the database refuses for lack of space fails with ErrNoSpace and sets OutOfSpace; one
// that commits clears it.
func (s *sqlStore) write(ctx context.Context, fn func(tx *sql.Tx, rev int64) (changed bool, err error)) (bool, error) {
	changed, err := s.writeTx(ctx, fn)
	if err != nil {
		return false, s.classified(err)
	}
	if changed {
		s.noSpace.Store(false)
	}
	return changed, nil
}

// writeTx is write's transaction.
func (s *sqlStore) writeTx(ctx context.Context, fn func(tx *sql.Tx, rev int64) (changed bool, err error)) (bool, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	var rev, horizon int64
	if err := tx.QueryRowContext(ctx, `UPDATE revision SET value = value + 1 WHERE id = 1 RETURNING value, horizon`).Scan(&rev, &horizon); err != nil {
		_ = tx.Rollback()
		return false, fmt.Errorf("bump revision: %w", err)
	}
	changed, err := fn(tx, rev)
	if err != nil || !changed {
		_ = tx.Rollback()
		return false, err
	}
	if horizon, err = s.prune(ctx, tx, rev, horizon); err != nil {
		_ = tx.Rollback()
		return false, fmt.Errorf("prune tombstones: %w", err)
	}
	var entry *logEntry
	if s.d == dialectPostgres {
		var note string
		if note, entry, err = s.revisionChanges(ctx, tx, rev, horizon); err != nil {
			_ = tx.Rollback()
			return false, fmt.Errorf("read the changes to notify: %w", err)
		}
		// Delivered to every listener when, and only if, the transaction commits.
		if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, ChangesChannel, note); err != nil {
			_ = tx.Rollback()
			return false, fmt.Errorf("notify: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("commit: %w", err)
	}
	if entry != nil && s.log != nil {
		s.log.record(entry) // before the signal, for the reader it wakes
	}
	s.advance(rev)
	s.notify()
	return true, nil
}

// prune drops, every pruneEvery revisions, the tombstones more than keep revisions old, and
// moves the horizon of ChangesSince past them. It returns the horizon as of rev, given the one
// before (horizon).
func (s *sqlStore) prune(ctx context.Context, tx *sql.Tx, rev, horizon int64) (int64, error) {
	next := rev - s.keep
	if rev%s.pruneEvery != 0 || next <= 0 {
		return horizon, nil
	}
	if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM tombstones WHERE revision <= ?`), next); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, s.d.rebind(`UPDATE revision SET horizon = ? WHERE id = 1 AND horizon < ?`), next, next); err != nil {
		return 0, err
	}
	return max(horizon, next), nil
}

// execer is a *sql.Tx or a stmtCache.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// stmtCache prepares each query once per transaction: Apply runs the same few statements for
// every item, and parsing them again each time is half of its cost on SQLite.
type stmtCache struct {
	tx    *sql.Tx
	stmts map[string]*sql.Stmt
}

func (c *stmtCache) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, ok := c.stmts[query]
	if !ok {
		var err error
		if st, err = c.tx.PrepareContext(ctx, query); err != nil {
			return nil, err
		}
		if c.stmts == nil {
			c.stmts = map[string]*sql.Stmt{}
		}
		c.stmts[query] = st
	}
	return st.ExecContext(ctx, args...)
}

func (c *stmtCache) close() {
	for _, st := range c.stmts {
		_ = st.Close()
	}
}

package main

// Bad rows: a MeshTimeout row whose labels or owners column is not JSON, written straight into
// PostgreSQL as a store write would (the revision bumped, the row stamped with it, the bare
// revision NOTIFYed, so every replica reads it at once), held, then fixed by an API write of
// the same resource, or, when the API cannot write it, by repairing the columns in SQL first.
// A row written by hand is no acknowledged write: only the API's answers are recorded, so the
// lost check holds the fixed rows to the fix, and the zones must end equal to the global.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kds-host/kds-host/host/store"
)

// badJSON is what a broken column holds.
const badJSON = "not json"

// badRow is a row broken by hand: column is "labels" (an existing row's) or "owners" (a row
// inserted by hand).
type badRow struct {
	name, column string
}

// badStats counts the bad rows injected, by column, and fixed, by how.
type badStats struct {
	seq            int // the last bad-NNNN name given
	labels, owners int
	byAPI, bySQL   int
}

// badRowFault breaks a row (the labels of one the API has just created, or the owners of one
// inserted by hand), holds it broken for hold, and fixes it.
func (s *soak) badRowFault(labels bool, hold time.Duration) {
	s.mu.Lock()
	s.bad.seq++
	b := badRow{name: fmt.Sprintf("bad-%04d", s.bad.seq), column: "owners"}
	s.mu.Unlock()
	var err error
	if labels {
		b.column = "labels"
		if !s.writeUntilApplied(b.name, "1s", 20) {
			s.log("bad row: %s not created through the API: not broken", b.name)
			return
		}
		err = s.sqlWrite(`UPDATE resources SET labels = $2, revision = $1 WHERE kind = 'MeshTimeout' AND mesh = 'default' AND name = $3`, badJSON, b.name)
	} else {
		now := time.Now().UnixMilli()
		spec := `{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"2s"}}`
		err = s.sqlWrite(`INSERT INTO resources (kind, mesh, name, mesh_ref, labels, owners, spec, generation, revision, created_ms, modified_ms)
			VALUES ('MeshTimeout', 'default', $2, 'default', '{}', $3, $4, 1, $1, $5, $5)`, b.name, badJSON, spec, now)
	}
	if err != nil {
		s.log("bad row: break %s's %s: %v", b.name, b.column, err)
		return
	}
	s.log("bad row: %s's %s is %q", b.name, b.column, badJSON)
	s.mu.Lock()
	s.broken[b.name] = b
	if labels {
		s.bad.labels++
	} else {
		s.bad.owners++
	}
	s.mu.Unlock()
	time.Sleep(hold)
	s.fixBadRow(b)
}

// fixBroken fixes every bad row still broken (the heal's part).
func (s *soak) fixBroken() {
	s.mu.Lock()
	var rows []badRow
	for _, b := range s.broken {
		rows = append(rows, b)
	}
	s.mu.Unlock()
	for _, b := range rows {
		s.fixBadRow(b)
	}
}

// fixBadRow writes b's resource through the API with a new timeout; when the API does not
// apply it within a few attempts, it repairs the columns in SQL and writes it through the API
// again. It leaves b broken when even the repair fails.
func (s *soak) fixBadRow(b badRow) {
	if s.writeUntilApplied(b.name, "3s", 10) {
		s.log("bad row: %s fixed by an API write", b.name)
		s.mu.Lock()
		s.bad.byAPI++
		delete(s.broken, b.name)
		s.mu.Unlock()
		return
	}
	if err := s.repairBadRow(b); err != nil {
		s.log("bad row: repair %s: %v", b.name, err)
		return
	}
	s.log("bad row: %s repaired in SQL", b.name)
	s.mu.Lock()
	s.bad.bySQL++
	delete(s.broken, b.name)
	s.mu.Unlock()
	s.writeUntilApplied(b.name, "4s", 20)
}

// repairBadRow makes b's labels and owners JSON again (empty, as the API writes them), in SQL.
func (s *soak) repairBadRow(b badRow) error {
	return s.sqlWrite(`UPDATE resources SET labels = '{}', owners = '[]', revision = $1 WHERE kind = 'MeshTimeout' AND mesh = 'default' AND name = $2`, b.name)
}

// writeUntilApplied PUTs the MeshTimeout name with value through the replicas in turn until one
// applies it, attempts times at most, and records every answer.
func (s *soak) writeUntilApplied(name, value string, attempts int) bool {
	for i := range attempts {
		o, _ := s.call(http.MethodPut, s.api(i%replicas), "/meshes/default/meshtimeouts/"+name, timeoutDoc(name, value))
		s.record(name, value, true, o)
		if o == applied {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

// sqlWrite runs stmt in one transaction as a store write does: the revision bumped first and
// given to stmt as $1 (args follow), stmt changing exactly one row, and the bare revision
// NOTIFYed on commit.
func (s *soak) sqlWrite(stmt string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var rev int64
		if err := tx.QueryRow(ctx, `UPDATE revision SET value = value + 1 WHERE id = 1 RETURNING value`).Scan(&rev); err != nil {
			return fmt.Errorf("bump the revision: %w", err)
		}
		tag, err := tx.Exec(ctx, stmt, append([]any{rev}, args...)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%d rows changed, not 1", tag.RowsAffected())
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, store.ChangesChannel, strconv.FormatInt(rev, 10)); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		return nil
	})
}

package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ZoneStream is a zone's KDS stream as the global replica serving it records it in the store.
type ZoneStream struct {
	Zone string `json:"zone"`
	// Replica is the id of the replica serving the stream; Address is where zones reach it.
	Replica string `json:"replica"`
	Address string `json:"address,omitempty"`
	// Since is when the stream opened; Heartbeat is when its replica last refreshed the record.
	Since     time.Time `json:"since"`
	Heartbeat time.Time `json:"heartbeat"`
}

// Heartbeat is one refresh of a replica's zone streams.
type Heartbeat struct {
	Replica, Address string
	Now              time.Time
	// Put are streams to write (opened since the last heartbeat, or all of them when the
	// replica's records were lost); Gone are zones whose stream on this replica closed. Every
	// zone put is also remembered as known (ZoneRegistry) until it is forgotten.
	Put  []ZoneStream
	Gone []string
	// ExpireBefore deletes the records of any replica not refreshed since then (a replica that
	// died keeps none for long); zero deletes nothing.
	ExpireBefore time.Time
}

// ZoneStreamRecorder is a Store that records which global replica serves each zone, as every
// Store Open returns is. A record is not a resource: writing one bumps no revision and signals
// no Changes.
type ZoneStreamRecorder interface {
	// RecordZoneStreams applies a heartbeat in one transaction: it deletes the Gone zones of
	// the replica, writes Put, refreshes every record of the replica to Now (its one heartbeat
	// row), and expires what is older than ExpireBefore. It returns how many records the
	// replica has after it (fewer than the streams it serves means some were expired, and the
	// next heartbeat should Put them all), or -1 for a heartbeat that only refreshes (no Put,
	// Gone or ExpireBefore): counting is left to one that changes or expires something.
	RecordZoneStreams(ctx context.Context, hb Heartbeat) (records int64, err error)
	// ZoneStreams returns the records refreshed at or after freshAfter, sorted by zone and
	// replica; OtherZoneStreams those of every replica but one.
	ZoneStreams(ctx context.Context, freshAfter time.Time) ([]ZoneStream, error)
	OtherZoneStreams(ctx context.Context, replica string, freshAfter time.Time) ([]ZoneStream, error)
}

// zoneStreamsChunk is how many zones one statement of RecordZoneStreams deletes or writes: 2,500
// parameters at most, within both databases' limits (32,766 for SQLite, 65,535 for PostgreSQL).
const zoneStreamsChunk = 500

// placeholders returns n groups of size question marks: "?, ?" for (2, 1), "(?, ?), (?, ?)" for
// (2, 2).
func placeholders(n, size int) string {
	group := strings.Repeat("?, ", size-1) + "?"
	if size > 1 {
		group = "(" + group + ")"
	}
	var b strings.Builder
	b.Grow(n * (len(group) + 2))
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(group)
	}
	return b.String()
}

// distinctZones returns put with each zone once, its last stream kept, as writing them one at a
// time would leave them: one statement may not upsert a row twice (PostgreSQL refuses it).
func distinctZones(put []ZoneStream) []ZoneStream {
	last := make(map[string]int, len(put))
	for i, z := range put {
		last[z.Zone] = i
	}
	if len(last) == len(put) {
		return put
	}
	out := make([]ZoneStream, 0, len(last))
	for i, z := range put {
		if last[z.Zone] == i {
			out = append(out, z)
		}
	}
	return out
}

// RecordZoneStreams implements ZoneStreamRecorder. A heartbeat that fails for lack of space sets
// OutOfSpace; one that succeeds does not clear it (a heartbeat may fit where a resource does not).
func (s *sqlStore) RecordZoneStreams(ctx context.Context, hb Heartbeat) (_ int64, err error) {
	defer s.timed(opRecordZoneStreams, time.Now(), &err)
	n, err := s.recordZoneStreams(ctx, hb)
	return n, s.classified(err)
}

func (s *sqlStore) recordZoneStreams(ctx context.Context, hb Heartbeat) (int64, error) {
	if hb.Replica == "" {
		return 0, errors.New("record zone streams: the replica id is empty")
	}
	now := hb.Now.UnixMilli()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("record zone streams of %s: begin: %w", hb.Replica, err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	ex := &stmtCache{tx: tx}
	defer ex.close()
	// A statement a chunk of zones, not one a zone: on PostgreSQL each is a round trip.
	for gone := range slices.Chunk(hb.Gone, zoneStreamsChunk) {
		args := make([]any, 0, 1+len(gone))
		args = append(args, hb.Replica)
		for _, z := range gone {
			args = append(args, z)
		}
		q := `DELETE FROM zone_streams WHERE replica = ? AND zone IN (` + placeholders(len(gone), 1) + `)`
		if _, err := ex.ExecContext(ctx, s.d.rebind(q), args...); err != nil {
			return 0, fmt.Errorf("record zone streams of %s: delete %d zones from %s: %w", hb.Replica, len(gone), gone[0], err)
		}
	}
	for put := range slices.Chunk(distinctZones(hb.Put), zoneStreamsChunk) {
		args := make([]any, 0, 5*len(put))
		for _, z := range put {
			args = append(args, z.Zone, hb.Replica, hb.Address, z.Since.UnixMilli(), now)
		}
		q := `INSERT INTO zone_streams (zone, replica, address, since_ms, heartbeat_ms) VALUES ` + placeholders(len(put), 5) + `
			ON CONFLICT (zone, replica) DO UPDATE SET address = excluded.address, since_ms = excluded.since_ms,
				heartbeat_ms = excluded.heartbeat_ms`
		if _, err := ex.ExecContext(ctx, s.d.rebind(q), args...); err != nil {
			return 0, fmt.Errorf("record zone streams of %s: put %d zones from %s: %w", hb.Replica, len(put), put[0].Zone, err)
		}
		if err := rememberZones(ctx, ex, s.d, put); err != nil {
			return 0, fmt.Errorf("record zone streams of %s: %w", hb.Replica, err)
		}
	}
	// One row refreshes every record of the replica (not one write per zone stream).
	if _, err := tx.ExecContext(ctx, s.d.rebind(`INSERT INTO replica_heartbeats (replica, heartbeat_ms) VALUES (?, ?)
		ON CONFLICT (replica) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms`), hb.Replica, now); err != nil {
		return 0, fmt.Errorf("record zone streams of %s: refresh: %w", hb.Replica, err)
	}
	if !hb.ExpireBefore.IsZero() {
		before := hb.ExpireBefore.UnixMilli()
		if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM zone_streams WHERE heartbeat_ms < ?
			AND replica NOT IN (SELECT replica FROM replica_heartbeats WHERE heartbeat_ms >= ?)`), before, before); err != nil {
			return 0, fmt.Errorf("record zone streams of %s: expire: %w", hb.Replica, err)
		}
		if _, err := tx.ExecContext(ctx, s.d.rebind(`DELETE FROM replica_heartbeats WHERE heartbeat_ms < ?`), before); err != nil {
			return 0, fmt.Errorf("record zone streams of %s: expire: %w", hb.Replica, err)
		}
	}
	n := int64(-1)
	if len(hb.Put) > 0 || len(hb.Gone) > 0 || !hb.ExpireBefore.IsZero() {
		if err := tx.QueryRowContext(ctx, s.d.rebind(`SELECT COUNT(*) FROM zone_streams WHERE replica = ?`), hb.Replica).Scan(&n); err != nil {
			return 0, fmt.Errorf("record zone streams of %s: count: %w", hb.Replica, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("record zone streams of %s: commit: %w", hb.Replica, err)
	}
	return n, nil
}

func (s *sqlStore) ZoneStreams(ctx context.Context, freshAfter time.Time) (_ []ZoneStream, err error) {
	defer s.timed(opZoneStreams, time.Now(), &err)
	return s.zoneStreams(ctx, freshAfter, "")
}

// OtherZoneStreams is ZoneStreams without the records of replica: what a replica's heartbeat
// reads, at the cost of the others' zones only.
func (s *sqlStore) OtherZoneStreams(ctx context.Context, replica string, freshAfter time.Time) (_ []ZoneStream, err error) {
	defer s.timed(opZoneStreams, time.Now(), &err)
	return s.zoneStreams(ctx, freshAfter, replica)
}

func (s *sqlStore) zoneStreams(ctx context.Context, freshAfter time.Time, except string) ([]ZoneStream, error) {
	// A record's heartbeat is the later of its own and its replica's.
	fresh := freshAfter.UnixMilli()
	rows, err := s.r.QueryContext(ctx, s.d.rebind(`SELECT z.zone, z.replica, z.address, z.since_ms,
			CASE WHEN r.heartbeat_ms > z.heartbeat_ms THEN r.heartbeat_ms ELSE z.heartbeat_ms END
		FROM zone_streams z LEFT JOIN replica_heartbeats r ON r.replica = z.replica
		WHERE (z.heartbeat_ms >= ? OR r.heartbeat_ms >= ?) AND z.replica <> ?`), fresh, fresh, except)
	if err != nil {
		return nil, fmt.Errorf("zone streams: %w", err)
	}
	defer rows.Close()
	var out []ZoneStream
	for rows.Next() {
		var z ZoneStream
		var since, hb int64
		if err := rows.Scan(&z.Zone, &z.Replica, &z.Address, &since, &hb); err != nil {
			return nil, fmt.Errorf("zone streams: %w", err)
		}
		z.Since, z.Heartbeat = time.UnixMilli(since), time.UnixMilli(hb)
		out = append(out, z)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("zone streams: %w", err)
	}
	// Sorted here for byte order on both databases (see List).
	sortZoneStreams(out)
	return out, nil
}

func sortZoneStreams(zs []ZoneStream) {
	slices.SortFunc(zs, func(a, b ZoneStream) int {
		return cmp.Or(strings.Compare(a.Zone, b.Zone), strings.Compare(a.Replica, b.Replica))
	})
}

package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// KnownZone is a zone some global replica has served.
type KnownZone struct {
	Zone string `json:"zone"`
	// FirstSeen is when its first recorded stream opened (the replica's clock).
	FirstSeen time.Time `json:"firstSeen"`
}

// ZoneRegistry is a Store that remembers every zone a global replica has served, as every Store
// Open returns is: RecordZoneStreams remembers each zone it puts, and the zone stays known, after
// its streams and its replica are gone, until ForgetZone.
type ZoneRegistry interface {
	// KnownZones returns every known zone, sorted by name.
	KnownZones(ctx context.Context) ([]KnownZone, error)
	// ForgetZone forgets a known zone and reports whether it was known. A zone that connects
	// again is known again from its next heartbeat.
	ForgetZone(ctx context.Context, zone string) (bool, error)
}

// rememberZones records the zones of put as known, keeping the first time of those known already.
func rememberZones(ctx context.Context, ex execer, d dialect, put []ZoneStream) error {
	args := make([]any, 0, 2*len(put))
	for _, z := range put {
		args = append(args, z.Zone, z.Since.UnixMilli())
	}
	q := `INSERT INTO known_zones (zone, first_seen_ms) VALUES ` + placeholders(len(put), 2) + ` ON CONFLICT (zone) DO NOTHING`
	if _, err := ex.ExecContext(ctx, d.rebind(q), args...); err != nil {
		return fmt.Errorf("remember %d zones from %s: %w", len(put), put[0].Zone, err)
	}
	return nil
}

// KnownZones implements ZoneRegistry.
func (s *sqlStore) KnownZones(ctx context.Context) (_ []KnownZone, err error) {
	defer s.timed(opKnownZones, time.Now(), &err)
	rows, err := s.r.QueryContext(ctx, `SELECT zone, first_seen_ms FROM known_zones`)
	if err != nil {
		return nil, fmt.Errorf("known zones: %w", err)
	}
	defer rows.Close()
	var out []KnownZone
	for rows.Next() {
		var z KnownZone
		var ms int64
		if err := rows.Scan(&z.Zone, &ms); err != nil {
			return nil, fmt.Errorf("known zones: %w", err)
		}
		z.FirstSeen = time.UnixMilli(ms)
		out = append(out, z)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("known zones: %w", err)
	}
	// Sorted here for byte order on both databases (see List).
	slices.SortFunc(out, func(a, b KnownZone) int { return strings.Compare(a.Zone, b.Zone) })
	return out, nil
}

// ForgetZone implements ZoneRegistry.
func (s *sqlStore) ForgetZone(ctx context.Context, zone string) (_ bool, err error) {
	defer s.timed(opForgetZone, time.Now(), &err)
	if zone == "" {
		return false, errors.New("forget zone: the zone's name is empty")
	}
	res, err := s.w.ExecContext(ctx, s.d.rebind(`DELETE FROM known_zones WHERE zone = ?`), zone)
	n, err := rowsAffected(res, err)
	if err != nil {
		return false, fmt.Errorf("forget zone %s: %w", zone, s.classified(err))
	}
	return n > 0, nil
}

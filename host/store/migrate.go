package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrSchemaTooNew: the database was migrated by a newer kds-host than this one.
var ErrSchemaTooNew = errors.New("database schema is newer than this kds-host")

// migration is one numbered step of the schema. Its statements are written once, in the SQL
// that SQLite and PostgreSQL share, and run in the migration transaction; what the two do not
// share (triggers) follows in sqlite or postgres, run on that dialect only. Then data, if set,
// writes in the same transaction what SQL alone cannot make (a random id).
type migration struct {
	version          int64
	name             string
	stmts            []string
	sqlite, postgres []string
	data             func(ctx context.Context, tx *sql.Tx, d dialect) error
}

// statements returns what the step runs on dialect d, in order.
func (m migration) statements(d dialect) []string {
	if d == dialectPostgres {
		return append(slices.Clip(m.stmts), m.postgres...)
	}
	return append(slices.Clip(m.stmts), m.sqlite...)
}

// migrations returns the schema's steps in version order. Append a step; never edit one that
// has shipped.
func migrations() []migration {
	return []migration{
		{version: 1, name: "meshes, resources, revision", stmts: []string{
			`CREATE TABLE meshes (
				name TEXT PRIMARY KEY
			)`,
			// mesh_ref is the foreign key that makes the database refuse a policy whose Mesh is
			// missing: mesh for a mesh-scoped resource, the Mesh's own name for a Mesh row (so
			// the meshes row and the Mesh resource come and go together), NULL for any other
			// global-scoped resource. The CHECKs keep it from being anything else.
			`CREATE TABLE resources (
				kind       TEXT NOT NULL,
				mesh       TEXT NOT NULL DEFAULT '',
				name       TEXT NOT NULL,
				mesh_ref   TEXT NULL REFERENCES meshes (name) ON DELETE CASCADE,
				labels     TEXT NOT NULL,
				owners     TEXT NOT NULL,
				spec       TEXT NOT NULL,
				generation BIGINT NOT NULL,
				PRIMARY KEY (kind, mesh, name),
				CHECK (kind <> 'Mesh' OR (mesh = '' AND mesh_ref IS NOT NULL AND mesh_ref = name)),
				CHECK (kind = 'Mesh' OR mesh = '' OR (mesh_ref IS NOT NULL AND mesh_ref = mesh)),
				CHECK (kind = 'Mesh' OR mesh <> '' OR mesh_ref IS NULL)
			)`,
			`CREATE INDEX resources_mesh_ref ON resources (mesh_ref)`,
			`CREATE TABLE revision (
				id    INTEGER PRIMARY KEY CHECK (id = 1),
				value BIGINT NOT NULL
			)`,
			`INSERT INTO revision (id, value) VALUES (1, 0)`,
		}},
		// Revisions per row and tombstones, for ChangesSince. A kds-host older than this step
		// that still writes to the database (a replica sharing PostgreSQL) would write rows at
		// revision 0 and bump the revision after its deletes' tombstones: upgrade the replicas
		// sharing a database together.
		{version: 2, name: "resource revisions, tombstones", stmts: []string{
			// The revision table first: a writer locks its row before anything else, so taking
			// it first here keeps the lock order of every transaction.
			//
			// horizon is the oldest revision ChangesSince can answer from: tombstones at or
			// below it are pruned, and deletes before this step left none.
			`ALTER TABLE revision ADD COLUMN horizon BIGINT NOT NULL DEFAULT 0`,
			`UPDATE revision SET horizon = value WHERE id = 1`,
			// The revision of the write that last changed the row; rows from before this step
			// are at 0, older than the horizon, so nobody asks about them.
			`ALTER TABLE resources ADD COLUMN revision BIGINT NOT NULL DEFAULT 0`,
			`CREATE INDEX resources_revision ON resources (revision)`,
			// The last delete of each key, cascades included (the trigger below).
			`CREATE TABLE tombstones (
				kind     TEXT NOT NULL,
				mesh     TEXT NOT NULL,
				name     TEXT NOT NULL,
				revision BIGINT NOT NULL,
				PRIMARY KEY (kind, mesh, name)
			)`,
			`CREATE INDEX tombstones_revision ON tombstones (revision)`,
		},
			// Every deleted row leaves a tombstone at the revision of its transaction (a writer
			// bumps the revision first, so the revision row holds it already), including the
			// rows a Mesh's delete removes by ON DELETE CASCADE: both databases fire row triggers
			// for cascaded deletes.
			sqlite: []string{
				`CREATE TRIGGER resources_tombstone AFTER DELETE ON resources FOR EACH ROW BEGIN
					INSERT INTO tombstones (kind, mesh, name, revision)
						VALUES (OLD.kind, OLD.mesh, OLD.name, (SELECT value FROM revision WHERE id = 1))
						ON CONFLICT (kind, mesh, name) DO UPDATE SET revision = excluded.revision;
				END`,
			},
			postgres: []string{
				`CREATE FUNCTION kds_resources_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					INSERT INTO tombstones (kind, mesh, name, revision)
						VALUES (OLD.kind, OLD.mesh, OLD.name, (SELECT value FROM revision WHERE id = 1))
						ON CONFLICT (kind, mesh, name) DO UPDATE SET revision = excluded.revision;
					RETURN NULL;
				END
				$$`,
				`CREATE TRIGGER resources_tombstone AFTER DELETE ON resources
					FOR EACH ROW EXECUTE FUNCTION kds_resources_tombstone()`,
			},
		},
		// The store's id, made with the schema (or when an older database is migrated), and
		// whatever else a control plane keeps beside its resources.
		{version: 3, name: "store meta, store id", stmts: []string{
			`CREATE TABLE store_meta (
				key   TEXT PRIMARY KEY,
				value TEXT NOT NULL
			)`,
		}, data: func(ctx context.Context, tx *sql.Tx, d dialect) error {
			id, err := newStoreID()
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, d.rebind(`INSERT INTO store_meta (key, value) VALUES (?, ?)`), IDMetaKey, id)
			return err
		}},
		// Which global replica serves each zone: one row per zone stream, refreshed by its
		// replica's heartbeat (times in Unix milliseconds of the replica's clock), so any replica
		// can tell an operator where every zone is. Not resources: no revision, no tombstones.
		{version: 4, name: "zone streams of global replicas", stmts: []string{
			`CREATE TABLE zone_streams (
				zone         TEXT NOT NULL,
				replica      TEXT NOT NULL,
				address      TEXT NOT NULL,
				since_ms     BIGINT NOT NULL,
				heartbeat_ms BIGINT NOT NULL,
				PRIMARY KEY (zone, replica)
			)`,
			`CREATE INDEX zone_streams_replica ON zone_streams (replica)`,
			`CREATE INDEX zone_streams_heartbeat ON zone_streams (heartbeat_ms)`,
		}},
		// When a resource was created and last changed, in Unix milliseconds of the writer's
		// clock, for `get`'s AGE (0 for what was stored before).
		{version: 5, name: "resource creation and modification times", stmts: []string{
			`ALTER TABLE resources ADD COLUMN created_ms BIGINT NOT NULL DEFAULT 0`,
			`ALTER TABLE resources ADD COLUMN modified_ms BIGINT NOT NULL DEFAULT 0`,
		}},
		// One heartbeat row per replica: a replica refreshes its own row instead of every one of
		// its zone streams (10,000 rows every 2 s at 10,000 zones). A zone stream's record is fresh
		// while its own heartbeat_ms is (as a replica of the version before writes it) or its
		// replica's row is.
		{version: 6, name: "replica heartbeats", stmts: []string{
			`CREATE TABLE replica_heartbeats (
				replica      TEXT PRIMARY KEY,
				heartbeat_ms BIGINT NOT NULL
			)`,
		}},
		// Where the replicas of a PostgreSQL store follow the changes relay: the hub, the one
		// replica that holds the relay lock and LISTENs, writes its address here once it holds
		// the lock (listen.go). One row; unused by SQLite.
		{version: 7, name: "changes relay hub", stmts: []string{
			`CREATE TABLE relay_hub (
				id      INTEGER PRIMARY KEY CHECK (id = 1),
				replica TEXT NOT NULL,
				address TEXT NOT NULL
			)`,
		}},
		// Every zone a replica has served (recorded with its first stream's heartbeat), kept
		// until an operator forgets it: a zone that is gone stays visible as disconnected. Seeded
		// with the zones of the zone streams recorded before this step.
		{version: 8, name: "known zones", stmts: []string{
			`CREATE TABLE known_zones (
				zone          TEXT PRIMARY KEY,
				first_seen_ms BIGINT NOT NULL
			)`,
			`INSERT INTO known_zones (zone, first_seen_ms) SELECT zone, MIN(since_ms) FROM zone_streams GROUP BY zone`,
		}},
	}
}

// newStoreID returns 128 random bits from crypto/rand as 32 hex digits.
func newStoreID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make a store id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// migrationLockID is the PostgreSQL advisory lock that serialises replicas migrating one
// database at the same time ("kdsmigr" in ASCII).
const migrationLockID = 0x6b64736d696772

// migrate brings the database to the newest version in ms, in one transaction, and returns the
// versions it applied (none when the schema is current). A database at a version newer than
// the newest in ms is an ErrSchemaTooNew.
func migrate(ctx context.Context, db *sql.DB, d dialect, ms []migration) (applied []int64, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if d == dialectPostgres {
		if _, err := tx.ExecContext(ctx, d.rebind(`SELECT pg_advisory_xact_lock(?)`), int64(migrationLockID)); err != nil {
			return nil, fmt.Errorf("migrate: lock: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL
	)`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	var current sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&current); err != nil {
		return nil, fmt.Errorf("migrate: read schema version: %w", err)
	}
	latest := int64(0)
	if len(ms) > 0 {
		latest = ms[len(ms)-1].version
	}
	if current.Int64 > latest {
		return nil, fmt.Errorf("migrate: %w: the database is at schema version %d and this kds-host knows versions up to %d; run a kds-host at least as new as the one that last wrote this database",
			ErrSchemaTooNew, current.Int64, latest)
	}
	for _, m := range ms {
		if m.version <= current.Int64 {
			continue
		}
		for _, stmt := range m.statements(d) {
			if _, err := tx.ExecContext(ctx, d.rebind(stmt)); err != nil {
				return nil, fmt.Errorf("migrate: version %d (%s): %w", m.version, m.name, err)
			}
		}
		if m.data != nil {
			if err := m.data(ctx, tx, d); err != nil {
				return nil, fmt.Errorf("migrate: version %d (%s): %w", m.version, m.name, err)
			}
		}
		if _, err := tx.ExecContext(ctx, d.rebind(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`),
			m.version, m.name, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
			return nil, fmt.Errorf("migrate: record version %d: %w", m.version, err)
		}
		applied = append(applied, m.version)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return applied, nil
}

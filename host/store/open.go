package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// ErrBadDSN: the store DSN names no database this package can open.
var ErrBadDSN = errors.New("bad store DSN")

// DefaultSQLiteFile is the SQLite file Open uses inside the data dir when the DSN is "" or
// "sqlite".
const DefaultSQLiteFile = "kds.db"

// sqliteReaders is the size of the SQLite read pool; writes go through one connection.
const sqliteReaders = 4

// Open opens (creating and migrating as needed) the store that dsn names:
//   - "" or "sqlite": the SQLite file <dataDir>/kds.db, creating dataDir;
//   - "sqlite:///abs/path.db", "sqlite://rel/path.db", or a bare path ending in ".db": that
//     SQLite file, creating its directory;
//   - "postgres://..." or "postgresql://...": a PostgreSQL database (the schema is created in
//     the connection's default schema).
//
// The schema is migrated in one transaction; a database migrated by a newer kds-host fails
// with ErrSchemaTooNew. Anything else is an ErrBadDSN.
func Open(ctx context.Context, dsn, dataDir string) (Store, error) {
	t, err := parseDSN(dsn, dataDir)
	if err != nil {
		return nil, err
	}
	if t.dialect == dialectPostgres {
		return openPostgres(ctx, t.pgConfig)
	}
	return openSQLite(ctx, t.path)
}

type target struct {
	dialect  dialect
	path     string          // SQLite
	pgConfig *pgx.ConnConfig // PostgreSQL
}

const dsnHelp = `use "sqlite" (the default: <data-dir>/` + DefaultSQLiteFile + `), "sqlite:///path/to/kds.db", a path ending in .db, or "postgres://user:password@host:5432/dbname"`

func parseDSN(dsn, dataDir string) (target, error) {
	dsn = strings.TrimSpace(dsn)
	lower := strings.ToLower(dsn)
	switch {
	case dsn == "" || lower == "sqlite":
		if dataDir == "" {
			return target{}, fmt.Errorf("store: %w: the default SQLite store needs a data dir (--data-dir)", ErrBadDSN)
		}
		return sqliteTarget(filepath.Join(dataDir, DefaultSQLiteFile))
	case strings.HasPrefix(lower, "sqlite://"):
		p := dsn[len("sqlite://"):]
		if p == "" {
			return target{}, fmt.Errorf("store: %w: %q names no file; %s", ErrBadDSN, dsn, dsnHelp)
		}
		return sqliteTarget(p)
	case strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://"):
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			// pgconn's error redacts the password.
			return target{}, fmt.Errorf("store: %w: %v", ErrBadDSN, err)
		}
		return target{dialect: dialectPostgres, pgConfig: cfg}, nil
	case !strings.Contains(dsn, "://") && strings.HasSuffix(strings.SplitN(lower, "?", 2)[0], ".db"):
		return sqliteTarget(dsn)
	case strings.Contains(dsn, "://"):
		// Name only the scheme: the rest may hold a password.
		scheme, _, _ := strings.Cut(dsn, "://")
		return target{}, fmt.Errorf("store: %w: unsupported scheme %q; %s", ErrBadDSN, scheme, dsnHelp)
	default:
		return target{}, fmt.Errorf("store: %w: %q is neither a known store nor a path ending in .db; %s", ErrBadDSN, dsn, dsnHelp)
	}
}

func sqliteTarget(path string) (target, error) {
	if strings.ContainsAny(path, "?#") {
		return target{}, fmt.Errorf("store: %w: SQLite path %q: '?' and '#' are not allowed (the store sets its own options)", ErrBadDSN, path)
	}
	return target{dialect: dialectSQLite, path: filepath.Clean(path)}, nil
}

// sqliteDSN is modernc.org/sqlite's "path?_pragma=name(value)&..." form. The writer enforces
// foreign keys (off by default in SQLite), waits for other processes' locks, uses WAL so
// readers never block it, and begins every transaction IMMEDIATE so a read-then-write
// transaction cannot fail to upgrade its lock. Readers are query-only.
func sqliteDSN(path string, writer bool) string {
	if writer {
		return path + "?_pragma=foreign_keys(1)&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	}
	return path + "?_pragma=busy_timeout(5000)&_pragma=query_only(1)"
}

func openSQLite(ctx context.Context, path string) (Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	w, err := sql.Open("sqlite", sqliteDSN(path, true))
	if err != nil {
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	// One writer connection: SQLite takes one writer at a time anyway, and the Store's
	// transactions then queue in database/sql instead of spinning on SQLITE_BUSY.
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	if err := w.PingContext(ctx); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	if _, err := migrate(ctx, w, dialectSQLite, migrations()); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	r, err := sql.Open("sqlite", sqliteDSN(path, false))
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	r.SetMaxOpenConns(sqliteReaders)
	r.SetMaxIdleConns(sqliteReaders)
	if err := r.PingContext(ctx); err != nil {
		_ = w.Close()
		_ = r.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	return newSQLStore(dialectSQLite, w, r), nil
}

func openPostgres(ctx context.Context, cfg *pgx.ConnConfig) (Store, error) {
	return openPostgresWith(ctx, cfg, defaultListenOptions())
}

// openPostgresWith opens a PostgreSQL store whose listener runs with opts.
func openPostgresWith(ctx context.Context, cfg *pgx.ConnConfig, opts listenOptions) (*sqlStore, error) {
	where := fmt.Sprintf("postgres %s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	db := stdlib.OpenDB(*cfg)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: open %s: %w", where, err)
	}
	if _, err := migrate(ctx, db, dialectPostgres, migrations()); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: open %s: %w", where, err)
	}
	s := newSQLStore(dialectPostgres, db, db)
	s.log = &changeLog{}
	rev, err := s.Revision(ctx)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: open %s: %w", where, err)
	}
	s.seen.Store(rev)
	s.listen = startListener(cfg, opts, s)
	return s, nil
}

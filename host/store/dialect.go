package store

import (
	"errors"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// dialect is the SQL database behind a Store. Queries are written once, with '?' placeholders,
// in the SQL both databases understand; the dialect rebinds placeholders and reads errors.
type dialect int

const (
	dialectSQLite dialect = iota
	dialectPostgres
)

func (d dialect) String() string {
	if d == dialectPostgres {
		return "postgres"
	}
	return "sqlite"
}

// rebind turns '?' placeholders into the dialect's: unchanged for SQLite, $1, $2, ... for
// PostgreSQL. A '?' inside a quoted literal or identifier is left alone.
func (d dialect) rebind(q string) string {
	if d != dialectPostgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	var quote byte // the open quote character, or 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0 // a doubled quote closes and reopens: same result
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// isForeignKeyViolation reports whether err is the database refusing a row whose foreign key
// points at nothing: SQLITE_CONSTRAINT_FOREIGNKEY (787) or PostgreSQL SQLSTATE 23503.
func (d dialect) isForeignKeyViolation(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23503"
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY ||
			strings.Contains(se.Error(), "FOREIGN KEY constraint failed")
	}
	return false
}

// isNoSpace reports whether err is the database refusing a write for lack of space: SQLITE_FULL
// (a full disk, or max_page_count reached), PostgreSQL SQLSTATE 53100 (disk_full), or ENOSPC.
func (d dialect) isNoSpace(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "53100"
	}
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL {
		return true
	}
	return errors.Is(err, syscall.ENOSPC)
}

// isShortOfResources reports whether err is the database short of memory or connections for
// now: PostgreSQL SQLSTATE class 53 (insufficient resources: out_of_memory 53200,
// too_many_connections 53300, configuration_limit_exceeded 53400) but disk_full, or SQLITE_NOMEM.
func (d dialect) isShortOfResources(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "53") && pe.Code != "53100"
	}
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_NOMEM
}

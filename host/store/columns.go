package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kds-host/kds-host/host/resource"
)

// ColumnError is a stored row that cannot be read: a value another version, a restore or a hand
// edit left in one of its columns. The row is left out of what the store answers; the others
// are not.
type ColumnError struct {
	Key resource.Key
	// Column is the first column of the row, in table order, that cannot be read.
	Column string
	// Generation is the row's generation, or 0 when that column is the one that cannot be read.
	Generation int64
	Err        error
}

func (e *ColumnError) Error() string {
	return fmt.Sprintf("%s: stored %s cannot be read: %v", e.Key, e.Column, e.Err)
}

func (e *ColumnError) Unwrap() error { return e.Err }

// UnreadableError is what List and ChangesSince report when some rows cannot be read: Rows, one
// *ColumnError each, sorted by key. What they return beside it is every other row.
type UnreadableError struct {
	Rows []*ColumnError
}

func (e *UnreadableError) Error() string {
	const named = 3
	parts := make([]string, 0, named+1)
	for i, r := range e.Rows {
		if i == named {
			parts = append(parts, fmt.Sprintf("and %d more", len(e.Rows)-named))
			break
		}
		parts = append(parts, r.Error())
	}
	return fmt.Sprintf("%d stored rows cannot be read (left out): %s", len(e.Rows), strings.Join(parts, "; "))
}

// Unreadable splits what List or ChangesSince returned as their error: the rows that cannot be
// read (the call's results hold every other row), and any other failure (the results are then
// nothing). Both are nil when err is.
func Unreadable(err error) ([]*ColumnError, error) {
	var u *UnreadableError
	if errors.As(err, &u) {
		return u.Rows, nil
	}
	return nil, err
}

// unreadable is the error of a read that left out rows, or nil when it left out none.
func unreadable(rows []*ColumnError) error {
	if len(rows) == 0 {
		return nil
	}
	sortColumnErrors(rows)
	return &UnreadableError{Rows: rows}
}

func sortColumnErrors(rows []*ColumnError) {
	slices.SortFunc(rows, func(a, b *ColumnError) int { return compareKeys(a.Key, b.Key) })
}

// rowColumns are the columns of a resources row, in the order selectColumns names them: how
// each stored value goes into a row (scan) and, when it needs more than that, from the row into
// a resource (decode). A value either refuses makes the row's *ColumnError naming that column;
// every column, those added later included, is read this way and no other.
var rowColumns = [...]struct {
	name   string
	scan   func(w *row, v any) error
	decode func(w *row, r *resource.Resource) error
}{
	{name: "kind", scan: func(w *row, v any) (err error) { w.key.Kind, err = text(v); return err }},
	{name: "mesh", scan: func(w *row, v any) (err error) { w.key.Mesh, err = text(v); return err }},
	{name: "name", scan: func(w *row, v any) (err error) { w.key.Name, err = text(v); return err }},
	{name: "labels", scan: func(w *row, v any) (err error) { w.labels, err = text(v); return err },
		decode: func(w *row, r *resource.Resource) error {
			if err := json.Unmarshal([]byte(w.labels), &r.Labels); err != nil {
				return err
			}
			if len(r.Labels) == 0 {
				r.Labels = nil
			}
			return nil
		}},
	{name: "owners", scan: func(w *row, v any) (err error) { w.owners, err = text(v); return err },
		decode: func(w *row, r *resource.Resource) error {
			if err := json.Unmarshal([]byte(w.owners), &r.Owners); err != nil {
				return err
			}
			if len(r.Owners) == 0 {
				r.Owners = nil
			}
			return nil
		}},
	{name: "spec", scan: func(w *row, v any) (err error) { w.spec, err = text(v); return err },
		decode: func(w *row, r *resource.Resource) error {
			if !json.Valid([]byte(w.spec)) {
				var v any
				return json.Unmarshal([]byte(w.spec), &v) // says where
			}
			r.Spec = json.RawMessage(w.spec)
			return nil
		}},
	{name: "generation", scan: func(w *row, v any) (err error) { w.gen, err = integer(v); return err }},
	{name: "created_ms", scan: func(w *row, v any) (err error) { w.createdMS, err = integer(v); return err }},
	{name: "modified_ms", scan: func(w *row, v any) (err error) { w.modifiedMS, err = integer(v); return err }},
}

// selectColumns is the column list of a query that scanRow reads.
var selectColumns = func() string {
	names := make([]string, len(rowColumns))
	for i, c := range rowColumns {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}()

// text reads a TEXT column's value as the drivers give it.
func text(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case nil:
		return "", errors.New("NULL, not text")
	}
	return "", fmt.Errorf("%T, not text", v)
}

// integer reads a BIGINT column's value as the drivers give it (SQLite keeps what does not
// parse as an integer as it was written).
func integer(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	case []byte:
		return strconv.ParseInt(string(v), 10, 64)
	case nil:
		return 0, errors.New("NULL, not an integer")
	}
	return 0, fmt.Errorf("%T %v, not an integer", v, v)
}

type scanner interface{ Scan(dest ...any) error }

// scanRow reads one row of selectColumns. Only the driver's failure is its error: a value that
// cannot be read is the row's unread, which decode reports.
func scanRow(s scanner) (row, error) {
	var vals [len(rowColumns)]any
	var dest [len(rowColumns)]any
	for i := range vals {
		dest[i] = &vals[i]
	}
	var w row
	if err := s.Scan(dest[:]...); err != nil {
		return w, err
	}
	for i, c := range rowColumns {
		if err := c.scan(&w, vals[i]); err != nil && w.unread == nil {
			w.unread = &ColumnError{Column: c.name, Err: err}
		}
	}
	if w.unread != nil {
		w.unread.Key = w.key
		if w.unread.Column != "generation" {
			w.unread.Generation = w.gen
		}
	}
	return w, nil
}

// decode reads w into a resource, or fails with the *ColumnError of its first column that
// cannot be read.
func (w row) decode() (resource.Resource, error) {
	if w.unread != nil {
		return resource.Resource{}, w.unread
	}
	r := resource.Resource{Kind: w.key.Kind, Mesh: w.key.Mesh, Name: w.key.Name, Generation: w.gen}
	if w.createdMS > 0 {
		r.CreationTime = time.UnixMilli(w.createdMS).UTC()
	}
	if w.modifiedMS > 0 {
		r.ModificationTime = time.UnixMilli(w.modifiedMS).UTC()
	}
	for _, c := range rowColumns {
		if c.decode == nil {
			continue
		}
		if err := c.decode(&w, &r); err != nil {
			return resource.Resource{}, &ColumnError{Key: w.key, Column: c.name, Generation: w.gen, Err: err}
		}
	}
	return r, nil
}

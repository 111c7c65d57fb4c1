package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/kds-host/kds-host/host/resource"
)

// A PostgreSQL write carries what it changed in its NOTIFY payload, when that is small, so that
// no replica (the writer included) reads it back with ChangesSince's query: each store keeps the
// recent revisions' changes in a changeLog and answers ChangesSince from it when it holds every
// revision asked for. The payload is either
//
//   - a bare revision, "42": what every write sent before, and what a write too large for the
//     payload still sends; a reader queries for it;
//   - a JSON object, {"r":42,"h":0,"c":[row...],"d":[["kind","mesh","name"]...]}: the revision,
//     the horizon of ChangesSince as of that revision, the rows stamped with it (each
//     {"k":kind,"m":mesh,"n":name,"l":labels,"o":owners,"s":spec,"g":generation,"c":created_ms,
//     "t":modified_ms}, labels, owners and spec the stored JSON embedded verbatim), and the keys
//     it deleted that it left absent, cascades included.
//
// A kds-host that reads only bare revisions takes the object for a payload it cannot parse and
// signals anyway, so its reader queries: replicas of both versions may share a database.

const (
	// changeLogSize is how many recent revisions a store keeps the changes of.
	changeLogSize = 1024
	// payloadMax bounds a payload carrying changes; PostgreSQL refuses 8000 bytes or more.
	payloadMax = 7500
	// payloadRowsMax and payloadDeletesMax bound what a write reads back for its payload: a row
	// as kds-host writes it takes more than 75 bytes of it and a deleted key at least 15, so a
	// write of more than these could not fit anyway and sends its bare revision without reading
	// them all.
	payloadRowsMax    = 100
	payloadDeletesMax = 500
)

// payload is a notification carrying a revision's changes.
type payload struct {
	Rev     int64        `json:"r"`
	Horizon int64        `json:"h,omitempty"`
	Changed []payloadRow `json:"c,omitempty"`
	Deleted []payloadKey `json:"d,omitempty"`
}

// payloadKey is a deleted key: [kind, mesh, name].
type payloadKey [3]string

// payloadRow is a row as the resources table holds it, as scanRow reads it.
type payloadRow struct {
	Kind       string          `json:"k"`
	Mesh       string          `json:"m,omitempty"`
	Name       string          `json:"n"`
	Labels     json.RawMessage `json:"l"`
	Owners     json.RawMessage `json:"o"`
	Spec       json.RawMessage `json:"s"`
	Generation int64           `json:"g"`
	CreatedMS  int64           `json:"c"`
	ModifiedMS int64           `json:"t"`
}

// logEntry is what one committed revision changed: the rows stamped with it and the keys it
// deleted and left absent, and the horizon of ChangesSince as of it. Never changed once made.
type logEntry struct {
	rev, horizon int64
	changed      []row
	deleted      []resource.Key
}

// revisionChanges reads, inside the write transaction tx at revision rev, what the revision
// changed, as changesSince reads it: the rows stamped with rev and the tombstones of rev whose
// key is absent. It returns the NOTIFY payload, and the entry for the change log when the payload
// carries the changes (nil when it is the bare revision: too large to carry).
func (s *sqlStore) revisionChanges(ctx context.Context, tx *sql.Tx, rev, horizon int64) (string, *logEntry, error) {
	bare := strconv.FormatInt(rev, 10)
	e := &logEntry{rev: rev, horizon: horizon}
	var err error
	if e.changed, err = s.revisionRows(ctx, tx, "=", rev, payloadRowsMax+1); err != nil {
		return "", nil, err
	}
	if len(e.changed) > payloadRowsMax {
		return bare, nil, nil
	}
	if e.deleted, err = s.revisionDeletes(ctx, tx, "=", rev, payloadDeletesMax+1); err != nil {
		return "", nil, err
	}
	if len(e.deleted) > payloadDeletesMax {
		return bare, nil, nil
	}
	p, ok := e.payload()
	if !ok {
		return bare, nil, nil
	}
	return p, e, nil
}

// payload encodes e, or reports false when it is too large or holds what would not come back
// byte for byte (JSON that is not compact, text that is not UTF-8: not what this store writes).
func (e *logEntry) payload() (string, bool) {
	p := payload{Rev: e.rev, Horizon: e.horizon}
	size := 0
	for _, w := range e.changed {
		for _, s := range []string{w.key.Kind, w.key.Mesh, w.key.Name} {
			if !utf8.ValidString(s) {
				return "", false
			}
		}
		for _, s := range []string{w.labels, w.owners, w.spec} {
			if !isCompactJSON(s) {
				return "", false
			}
		}
		if size += len(w.labels) + len(w.owners) + len(w.spec); size > payloadMax {
			return "", false // too large whatever the rest
		}
		p.Changed = append(p.Changed, payloadRow{Kind: w.key.Kind, Mesh: w.key.Mesh, Name: w.key.Name,
			Labels: json.RawMessage(w.labels), Owners: json.RawMessage(w.owners), Spec: json.RawMessage(w.spec),
			Generation: w.gen, CreatedMS: w.createdMS, ModifiedMS: w.modifiedMS})
	}
	for _, k := range e.deleted {
		if !utf8.ValidString(k.Kind) || !utf8.ValidString(k.Mesh) || !utf8.ValidString(k.Name) {
			return "", false
		}
		p.Deleted = append(p.Deleted, payloadKey{k.Kind, k.Mesh, k.Name})
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the embedded JSON stays as stored
	if err := enc.Encode(&p); err != nil {
		return "", false
	}
	out := strings.TrimSuffix(b.String(), "\n")
	if len(out) > payloadMax {
		return "", false
	}
	return out, true
}

// isCompactJSON reports whether s is valid JSON without insignificant white space: what the
// encoder embeds unchanged.
func isCompactJSON(s string) bool {
	var b bytes.Buffer
	return json.Compact(&b, []byte(s)) == nil && b.Len() == len(s)
}

// errPayload: a notification payload that is neither a bare revision nor a change this store
// reads (another program's, or a newer kds-host's with fields this one does not know).
var errPayload = errors.New("not a kds-host change payload")

// parsePayload reads a notification's payload: the revision, and its changes when it carries
// them (entry nil for a bare revision).
func parsePayload(s string) (rev int64, entry *logEntry, err error) {
	if !strings.HasPrefix(s, "{") {
		rev, err := strconv.ParseInt(s, 10, 64)
		if err != nil || rev < 0 {
			return -1, nil, errPayload
		}
		return rev, nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields() // a newer format: not to be taken for this one
	var p payload
	if err := dec.Decode(&p); err != nil {
		return -1, nil, errPayload
	}
	if _, err := dec.Token(); err != io.EOF || p.Rev <= 0 {
		return -1, nil, errPayload
	}
	e := &logEntry{rev: p.Rev, horizon: p.Horizon, changed: make([]row, 0, len(p.Changed)), deleted: make([]resource.Key, 0, len(p.Deleted))}
	for _, c := range p.Changed {
		if c.Kind == "" || c.Name == "" || len(c.Labels) == 0 || len(c.Owners) == 0 || len(c.Spec) == 0 {
			return -1, nil, errPayload
		}
		e.changed = append(e.changed, row{
			key:    resource.Key{Kind: c.Kind, Mesh: c.Mesh, Name: c.Name},
			labels: string(c.Labels), owners: string(c.Owners), spec: string(c.Spec),
			gen: c.Generation, createdMS: c.CreatedMS, modifiedMS: c.ModifiedMS,
		})
	}
	for _, k := range p.Deleted {
		if k[0] == "" || k[2] == "" {
			return -1, nil, errPayload
		}
		e.deleted = append(e.deleted, resource.Key{Kind: k[0], Mesh: k[1], Name: k[2]})
	}
	return p.Rev, e, nil
}

// changeLog holds the changes of the last changeLogSize revisions the store heard of with their
// contents: its own writes, and other writers' notifications that carried them. A revision it
// does not hold (a bare payload, one missed while LISTEN was down, one older than the log) makes
// ChangesSince query for any span that includes it.
type changeLog struct {
	mu sync.Mutex // guards slots
	// slots holds revision r at r % changeLogSize: a newer revision replaces the oldest.
	slots [changeLogSize]*logEntry
}

// record keeps e. The writer records its own revision after commit and its LISTEN connection
// hears the same revision: both entries hold the same, so the first stays. An entry older than
// the one in its slot is too old to keep.
func (l *changeLog) record(e *logEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := e.rev % changeLogSize
	if old := l.slots[i]; old == nil || old.rev < e.rev {
		l.slots[i] = e
	}
}

// changesSince answers ChangesSince(since) as of revision top, the newest the store heard of,
// from the log; ok is false when the log does not hold every revision from since+1 to top (or
// top itself, whose horizon it needs), and the caller queries. Its answer is the query's for
// the same revisions: the rows last written by them, sorted by key, and the keys they deleted
// that are absent at top, sorted too.
func (l *changeLog) changesSince(since, top int64) (changed []resource.Resource, deleted []resource.Key, now int64, ok bool, err error) {
	if since > top || since < 0 || top-since > changeLogSize {
		return nil, nil, 0, false, nil
	}
	// The state at top of each key some revision after since touched: its row, or nil when
	// deleted.
	var last map[resource.Key]*row
	l.mu.Lock()
	e := l.slots[top%changeLogSize]
	if e == nil || e.rev != top {
		l.mu.Unlock()
		return nil, nil, 0, false, nil
	}
	horizon := e.horizon
	for r := since + 1; r <= top; r++ {
		e := l.slots[r%changeLogSize]
		if e == nil || e.rev != r {
			l.mu.Unlock()
			return nil, nil, 0, false, nil
		}
		if last == nil && (len(e.changed) > 0 || len(e.deleted) > 0) {
			last = map[resource.Key]*row{}
		}
		for i := range e.changed {
			last[e.changed[i].key] = &e.changed[i]
		}
		for _, k := range e.deleted {
			last[k] = nil
		}
	}
	l.mu.Unlock()
	if since < horizon {
		return nil, nil, 0, true, errBeforeHorizon(horizon)
	}
	// Entries are never changed once recorded: decoding outside the lock makes each caller its
	// own copies.
	var bad []*ColumnError
	for k, c := range last {
		if c == nil {
			deleted = append(deleted, k)
			continue
		}
		r, err := c.decode()
		if err != nil {
			bad = append(bad, err.(*ColumnError)) // as the query reads it
			continue
		}
		changed = append(changed, r)
	}
	slices.SortFunc(changed, func(a, b resource.Resource) int { return compareKeys(a.Key(), b.Key()) })
	slices.SortFunc(deleted, compareKeys)
	return changed, deleted, top, true, unreadable(bad)
}

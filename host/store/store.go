// Package store keeps resources in a SQL database (SQLite by default, PostgreSQL for shared
// global replicas) whose schema enforces ownership: a policy's mesh is a FOREIGN KEY to the
// meshes table, so the database itself refuses a policy whose Mesh is missing.
package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/kds-host/kds-host/host/resource"
)

var (
	// ErrNotFound: no resource with that key.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the caller's generation is not the stored one (optimistic concurrency).
	ErrConflict = errors.New("generation conflict")
	// ErrResync: ChangesSince cannot tell what changed since that revision (it is older than
	// the changes the store keeps, or not one of this database's); List everything instead.
	ErrResync = errors.New("changes since that revision are not kept: list everything")
	// ErrReservedMetaKey: SetMeta was asked to set IDMetaKey, which the schema sets once.
	ErrReservedMetaKey = errors.New("reserved meta key: the store id is set once, when the schema is created")
)

// IDMetaKey is the meta key that holds the store's id (see Store.ID).
const IDMetaKey = "store_id"

// Result is what a Write did.
type Result int

const (
	// Unchanged: the resource was stored with identical content already; nothing was written.
	Unchanged Result = iota
	// Created: no resource had that key.
	Created
	// Updated: the stored resource had other content.
	Updated
)

func (r Result) String() string {
	switch r {
	case Created:
		return "created"
	case Updated:
		return "updated"
	case Unchanged:
		return "unchanged"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// MissingOwnerError is the database refusing a mesh-scoped resource whose Mesh is not stored.
type MissingOwnerError struct {
	Key   resource.Key
	Owner resource.Key
}

func (e *MissingOwnerError) Error() string {
	return fmt.Sprintf("%s: owner %s is missing (foreign key)", e.Key, e.Owner)
}

// Store is the resource database. Implementations are safe for concurrent use.
type Store interface {
	// Get returns one resource, or ErrNotFound.
	Get(ctx context.Context, key resource.Key) (resource.Resource, error)
	// List returns resources sorted by (kind, mesh, name); an empty kind or mesh matches all.
	List(ctx context.Context, kind, mesh string) ([]resource.Resource, error)
	// Put creates or updates r (already validated). If r.Generation is not zero it must equal the
	// stored generation, else ErrConflict. A write that changes content bumps the generation;
	// one with identical content changes nothing and reports changed=false. A mesh-scoped
	// resource whose Mesh is missing fails with *MissingOwnerError.
	Put(ctx context.Context, r resource.Resource) (stored resource.Resource, changed bool, err error)
	// Write is Put that says what it did and, only when it creates r, writes onCreate in the
	// same transaction: resources that come into being with r, such as a new Mesh's default
	// policies, written at generation 1, skipping any already stored. Either r and all of
	// onCreate commit or nothing does; of concurrent Writes creating one key, exactly one
	// reports Created and writes onCreate, and the others see Updated or Unchanged.
	Write(ctx context.Context, r resource.Resource, onCreate []resource.Resource) (stored resource.Resource, result Result, err error)
	// WriteBatch writes items in one transaction, each as Write would: an item the database
	// refuses (a missing owner, a generation conflict) is reported in its outcome and the
	// others are stored. The error is for the transaction as a whole: ErrNoSpace (nothing of
	// the batch is stored) when the database has no room for it.
	WriteBatch(ctx context.Context, items []WriteItem) ([]WriteOutcome, error)
	// Delete removes one resource, or returns ErrNotFound. Deleting a Mesh deletes the
	// resources in it (ON DELETE CASCADE).
	Delete(ctx context.Context, key resource.Key) error
	// Apply writes a batch in one transaction, as a zone applies a response: resources are
	// written as given (generation included), each on its own savepoint, so an item the database
	// refuses is reported in failed and the others commit. Items run in this order: puts of
	// Meshes, other puts, deletes of other kinds, deletes of Meshes; deleting an absent key is
	// not a failure. A database without room for it fails the whole batch with ErrNoSpace.
	Apply(ctx context.Context, puts []resource.Resource, deletes []resource.Key) (failed map[resource.Key]error, err error)
	// Revision is a counter that every committed write increases; replicas sharing a database
	// compare it to notice each other's writes.
	Revision(ctx context.Context) (int64, error)
	// ChangesSince returns what the writes after revision since did, as of revision now: the
	// resources they created or changed (sorted by key, as List sorts) and the keys they
	// deleted that are still absent, cascades included. It fails with ErrResync when it cannot
	// tell (since is older than the changes the store keeps, or newer than now); the caller then
	// Lists everything. A caller that took a revision before a List may get changes the List
	// already had: applying them again changes nothing. A PostgreSQL store answers from the
	// changes the writes' notifications carried, when it holds every revision asked for, as of
	// the newest revision it heard of: now may be older than Revision until the notification of
	// a newer write arrives, and signals Changes.
	ChangesSince(ctx context.Context, since int64) (changed []resource.Resource, deleted []resource.Key, now int64, err error)
	// Changes is signalled (coalesced, never blocking the writer) after every committed write
	// made through this Store value. A PostgreSQL store also signals it for writes other
	// processes commit to the same database: each write NOTIFYs (ChangesChannel, the revision as
	// payload) in its transaction, and the store LISTENs on a connection of its own; while that
	// connection is down it reads the revision every 250ms instead, and signals once more when
	// it is back, so a reader that calls ChangesSince on each signal misses nothing.
	Changes() <-chan struct{}
	// ID is the store's id: random, made when the schema was created (or migrated to hold one),
	// never changed. Every replica sharing a database sees the same id; a new or emptied
	// database has a new one, so whoever remembers the id can tell a lost store from its own.
	ID(ctx context.Context) (string, error)
	// Meta returns the value stored under key (ok is false when none is), for what a control
	// plane remembers beside its resources, such as the id of the global a zone follows.
	Meta(ctx context.Context, key string) (value string, ok bool, err error)
	// SetMeta stores value under key, replacing any value. Meta is not a resource: SetMeta
	// bumps no revision and signals no Changes. IDMetaKey is refused with ErrReservedMetaKey.
	SetMeta(ctx context.Context, key, value string) error
	Close() error
}

// WriteItem is one resource of a WriteBatch, and what is created with it when it is created (a
// Mesh's default policies).
type WriteItem struct {
	Resource resource.Resource
	OnCreate []resource.Resource
}

// WriteOutcome is what a WriteBatch did with one item: Err, or what is stored and how.
type WriteOutcome struct {
	Stored resource.Resource
	Result Result
	Err    error
}

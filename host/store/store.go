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
)

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
	// Delete removes one resource, or returns ErrNotFound. Deleting a Mesh deletes the
	// resources in it (ON DELETE CASCADE).
	Delete(ctx context.Context, key resource.Key) error
	// Apply writes a batch in one transaction, as a zone applies a response: resources are
	// written as given (generation included), each on its own savepoint, so an item the database
	// refuses is reported in failed and the others commit. Items run in this order: puts of
	// Meshes, other puts, deletes of other kinds, deletes of Meshes; deleting an absent key is
	// not a failure.
	Apply(ctx context.Context, puts []resource.Resource, deletes []resource.Key) (failed map[resource.Key]error, err error)
	// Revision is a counter that every committed write increases; replicas sharing a database
	// poll it to notice each other's writes.
	Revision(ctx context.Context) (int64, error)
	// ChangesSince returns what the writes after revision since did, as of revision now: the
	// resources they created or changed (sorted by key, as List sorts) and the keys they
	// deleted that are still absent, cascades included. It fails with ErrResync when it cannot
	// tell (since is older than the changes the store keeps, or newer than now); the caller then
	// Lists everything. A caller that took a revision before a List may get changes the List
	// already had: applying them again changes nothing.
	ChangesSince(ctx context.Context, since int64) (changed []resource.Resource, deleted []resource.Key, now int64, err error)
	// Changes is signalled (coalesced, never blocking the writer) after every committed write
	// made through this Store value.
	Changes() <-chan struct{}
	Close() error
}

package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/store"
)

// StoreIDFile is the file under the data dir where a global records the id of the store it
// serves.
const StoreIDFile = "store-id"

// StoreIdentityError is a global refusing a store that is not the one it served: its data dir
// records another store's id.
type StoreIdentityError struct {
	// Marker is the file that records the id of the store the global served.
	Marker string
	// Recorded is the id in Marker; Found is the id of the store opened now.
	Recorded, Found string
	// Resources is how many resources the store opened now holds.
	Resources int
}

func (e *StoreIdentityError) Error() string {
	holds := fmt.Sprintf("holds %d resources", e.Resources)
	switch e.Resources {
	case 0:
		holds = "holds no resources"
	case 1:
		holds = "holds 1 resource"
	}
	return fmt.Sprintf("store identity: %s records that this global served store %q, but the store it opened is %q and %s; "+
		"serving it would make zones drop what they were sent (a lost, emptied or replaced database: "+
		"a SQLite file deleted or truncated, another PostgreSQL database); restore the store this global served, "+
		"or, if this new store is intended, accept it to record its id in %s",
		e.Marker, e.Recorded, e.Found, holds, e.Marker)
}

// CheckStoreIdentity makes sure a global serves the store it served before. The data dir keeps
// the id of that store (StoreIDFile, mode 0600): on the first start, when there is none, st's id
// is recorded; later the store's id must equal it, else the start is refused with a
// *StoreIdentityError naming both ids. With acceptNew a store with another id is taken as
// intended: its id replaces the recorded one, with a warning.
func CheckStoreIdentity(ctx context.Context, st store.Store, dataDir string, acceptNew bool, log hclog.Logger) error {
	if dataDir == "" {
		return errors.New("store identity: no data dir to record the store's id in")
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	id, err := st.ID(ctx)
	if err != nil {
		return fmt.Errorf("store identity: %w", err)
	}
	marker := filepath.Join(dataDir, StoreIDFile)
	b, err := os.ReadFile(marker)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := writeStoreID(marker, id); err != nil {
			return err
		}
		log.Info("recorded the id of the store this global serves", "store_id", id, "file", marker)
		return nil
	case err != nil:
		return fmt.Errorf("store identity: read the id of the store this global served: %w", err)
	}
	recorded := strings.TrimSpace(string(b))
	if recorded == id {
		return nil
	}
	resources, err := st.List(ctx, "", "")
	unreadable, err := store.Unreadable(err) // stored all the same: counted
	if err != nil {
		return fmt.Errorf("store identity: %w", err)
	}
	refused := &StoreIdentityError{Marker: marker, Recorded: recorded, Found: id, Resources: len(resources) + len(unreadable)}
	if !acceptNew {
		return refused
	}
	if err := writeStoreID(marker, id); err != nil {
		return err
	}
	log.Warn("serving a new store, as asked: the store this global served before is no longer served",
		"store_id", id, "previous_store_id", recorded, "resources", refused.Resources, "file", marker)
	return nil
}

// writeStoreID records id in marker (mode 0600) through a temporary file and a rename, so a
// crash leaves the old id or the new one, never part of one.
func writeStoreID(marker, id string) error {
	if err := auth.WriteFileAtomic(marker, []byte(id+"\n"), 0o600); err != nil {
		return fmt.Errorf("store identity: record the store's id in %s: %w", marker, err)
	}
	return nil
}

package guard

import "github.com/kds-host/kds-host/engine"

// SnapshotOf is what c serves now, for the package's external tests.
func SnapshotOf(c *Cache) *engine.Snapshot { return c.s.Cache.Snapshot() }

package main

import (
	"context"
	"fmt"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
)

// The values of --cache.
const (
	cacheSnapshot = "snapshot" // a SnapshotCache, one snapshot for every node
	cacheLinear   = "linear"   // a LinearCache per type behind a MuxCache; the guard is told it answers every node alike
	cacheMux      = "mux"      // the same MuxCache, given to the guard as it is (guard.New's defaults: shared too)
	cacheKDS      = "kds"      // kds-host's own cache, guard.NewCache
)

// cacheKinds are the values of --cache, in the order the errors name them.
var cacheKinds = []string{cacheSnapshot, cacheLinear, cacheMux, cacheKDS}

// linearCaches are --cache linear's and mux's: a LinearCache per type the file may hold, and a
// MuxCache that routes each request to its type's by type URL.
type linearCaches struct {
	byType map[string]*cache.LinearCache
	mux    *cache.MuxCache
}

func newLinearCaches(log hclog.Logger) *linearCaches {
	l := &linearCaches{byType: map[string]*cache.LinearCache{}}
	caches := map[string]cache.Cache{}
	for _, t := range kdsCacheTypes {
		lc := cache.NewLinearCache(t, cache.WithLogger(cacheLogger(log)))
		l.byType[t], caches[t] = lc, lc
	}
	l.mux = &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        caches,
	}
	return l
}

// set serves res: each type's LinearCache is given what changed of it (resources new or whose
// content differs, and those gone), in kdsCacheTypes' order (clusters first), and a type whose
// resources did not change is not touched. The LinearCaches keep their own versions; version
// is the file's.
func (l *linearCaches) set(_ context.Context, _ string, res map[string][]types.Resource) error {
	for t := range res {
		if l.byType[t] == nil {
			return fmt.Errorf("--cache %s serves no %s", cacheLinear, t)
		}
	}
	for _, t := range kdsCacheTypes {
		lc := l.byType[t]
		cur := lc.GetResources()
		update := map[string]types.Resource{}
		keep := make(map[string]bool, len(res[t]))
		for _, r := range res[t] {
			name := cache.GetResourceName(r)
			keep[name] = true
			if old, ok := cur[name]; !ok || !proto.Equal(old, r) {
				update[name] = r
			}
		}
		var gone []string
		for name := range cur {
			if !keep[name] {
				gone = append(gone, name)
			}
		}
		if len(update) == 0 && len(gone) == 0 {
			continue
		}
		if err := lc.UpdateResources(update, gone); err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
	}
	return nil
}

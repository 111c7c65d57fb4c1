package controlplane

import (
	"net/http"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// unservable is what the global stores and cannot read or encode for zones (kds.SnapshotBuilder
// skips it, and keeps serving its earlier version if it had one): logged once per resource,
// generation and column, counted in kds_unservable_resources, listed by GET /api/unservable and
// on the status page, until it is fixed or deleted.
type unservable struct {
	log hclog.Logger

	mu     sync.Mutex // guards items and logged
	items  []kds.Unservable
	logged map[resource.Key]logged // what was logged, per resource
}

// logged is what the log said of one unservable resource.
type logged struct {
	generation int64
	column     string
}

func newUnservable(log hclog.Logger) *unservable {
	return &unservable{log: log, items: []kds.Unservable{}, logged: map[resource.Key]logged{}}
}

// set records what the last snapshot could not read or encode, and logs what is new.
func (u *unservable) set(items []kds.Unservable) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := make(map[resource.Key]logged, len(items))
	for _, it := range items {
		l := logged{generation: it.Generation, column: it.Column}
		now[it.Key] = l
		if was, ok := u.logged[it.Key]; ok && was == l {
			continue
		}
		if it.Column != "" {
			u.log.Error("a stored row cannot be read: it is not served (its earlier version, if any, still is) until it is written again, fixed or deleted",
				"resource", it.Key.String(), "generation", it.Generation, "column", it.Column, "error", it.Error)
			continue
		}
		u.log.Error("a stored resource cannot be encoded for zones: it is not served (its earlier version, if any, still is) until it is fixed or deleted",
			"resource", it.Key.String(), "generation", it.Generation, "error", it.Error)
	}
	u.logged = now
	u.items = items
}

// recheckMax is how many unservable resources the global reads again by key on each poll tick.
const recheckMax = 64

// inTurn returns at most n of items (sorted by key) in turn: those after the key named after,
// then from the first; and the key of the last one returned.
func inTurn(items []kds.Unservable, after string, n int) ([]kds.Unservable, string) {
	if len(items) <= n {
		if len(items) == 0 {
			return nil, ""
		}
		return items, items[len(items)-1].Key.String()
	}
	i, _ := slices.BinarySearchFunc(items, after, func(u kds.Unservable, k string) int {
		if u.Key.String() <= k {
			return -1
		}
		return 1
	})
	out := make([]kds.Unservable, 0, n)
	for len(out) < n {
		out = append(out, items[i%len(items)])
		i++
	}
	return out, out[len(out)-1].Key.String()
}

// unservableRows splits a store read's error: the rows it could not read, as the snapshot
// builder lists them, and any other failure.
func unservableRows(err error) ([]kds.Unservable, error) {
	rows, err := store.Unreadable(err)
	if err != nil {
		return nil, err
	}
	out := make([]kds.Unservable, len(rows))
	for i, r := range rows {
		out[i] = unservableRow(r)
	}
	return out, nil
}

func unservableRow(r *store.ColumnError) kds.Unservable {
	return kds.Unservable{Key: r.Key, Generation: r.Generation, Column: r.Column, Error: r.Err.Error()}
}

func (u *unservable) list() []kds.Unservable {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.items
}

func (g *Global) serveUnservable(w http.ResponseWriter, _ *http.Request) {
	items := g.unservable.list()
	api.WriteJSON(w, http.StatusOK, map[string]any{"items": items, "total": len(items)})
}

var unservableDesc = prometheus.NewDesc("kds_unservable_resources",
	"Stored resources the global cannot read or encode for zones (not served until fixed), by kind.", []string{"kind"}, nil)

func (u *unservable) Describe(ch chan<- *prometheus.Desc) { ch <- unservableDesc }

func (u *unservable) Collect(ch chan<- prometheus.Metric) {
	byKind := map[string]int{}
	for _, it := range u.list() {
		byKind[it.Key.Kind]++
	}
	for kind, n := range byKind {
		ch <- prometheus.MustNewConstMetric(unservableDesc, prometheus.GaugeValue, float64(n), kind)
	}
}

package controlplane

import (
	"net/http"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// unservable is what the global stores and cannot encode for zones (kds.SnapshotBuilder skips
// it, and keeps serving its earlier version if it had one): logged once per resource and
// generation, counted in kds_unservable_resources, listed by GET /api/unservable and on the
// status page, until it is fixed or deleted.
type unservable struct {
	log hclog.Logger

	mu     sync.Mutex
	items  []kds.Unservable
	logged map[resource.Key]int64 // the generation logged, per resource
}

func newUnservable(log hclog.Logger) *unservable {
	return &unservable{log: log, items: []kds.Unservable{}, logged: map[resource.Key]int64{}}
}

// set records what the last snapshot could not encode, and logs what is new.
func (u *unservable) set(items []kds.Unservable) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := make(map[resource.Key]int64, len(items))
	for _, it := range items {
		now[it.Key] = it.Generation
		if gen, ok := u.logged[it.Key]; !ok || gen != it.Generation {
			u.log.Error("a stored resource cannot be encoded for zones: it is not served (its earlier version, if any, still is) until it is fixed or deleted",
				"resource", it.Key.String(), "generation", it.Generation, "error", it.Error)
		}
	}
	u.logged = now
	u.items = items
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
	"Stored resources the global cannot encode for zones (not served until fixed), by kind.", []string{"kind"}, nil)

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

package guard

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/policy"
)

// ClientInsight is what the guard knows of one client stream, the shape of kds-host's
// /api/zones entries.
type ClientInsight struct {
	// Stream is the server's stream id; the state-of-the-world and the delta server number
	// their streams apart, so Delta says which.
	Stream int64          `json:"stream"`
	Delta  bool           `json:"delta,omitempty"`
	Node   string         `json:"node"`
	Types  []*TypeInsight `json:"types"`
}

// TypeInsight is one type on one client stream.
type TypeInsight struct {
	TypeURL   string     `json:"typeUrl"`
	Responses int64      `json:"responses"`
	ACKs      int64      `json:"acks"`
	NACKs     int64      `json:"nacks"`
	Resent    int64      `json:"resent"`
	LastError string     `json:"lastError,omitempty"`
	Withheld  []Withheld `json:"withheld,omitempty"`
}

// Withheld is a resource version the client does not get now, and why.
type Withheld struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Reason  string `json:"reason"`
}

// totals are the guard's counts since it started, by type URL (the insight's are per open stream).
type totals struct {
	mu               sync.Mutex // guards nacks and responses
	nacks, responses map[string]int64
	refusals         map[string]int64 // by reason
}

func (t *totals) add(m *map[string]int64, typeURL string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[typeURL]++
}

// Handler serves Clients as JSON ({"items": [...], "total": N}), to mount in the server's own
// admin listener (it reveals node ids and refusal messages: keep it where the operators are).
func (g *Guard) Handler() http.Handler { return insightHandler(g.Clients) }

// Handler serves Clients as JSON, as Guard.Handler does.
func (c *Cache) Handler() http.Handler { return insightHandler(c.Clients) }

func insightHandler(clients func() []ClientInsight) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		items := clients()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"items": items, "total": len(items)})
	})
}

// refusalReasons are exported from the start, at 0 (an alert's rate misses a series' first
// event).
var refusalReasons = []string{"limit", "invalid"}

// Collector exports the guard's counts to Prometheus (Options.Metrics names them), and the
// metrics of its plugins (Options.Plugins).
func (g *Guard) Collector() prometheus.Collector {
	return collector{clients: g.Clients, totals: &g.totals, d: g.descs, rt: g.rt}
}

// Collector exports the cache's counts to Prometheus, as Guard.Collector does.
func (c *Cache) Collector() prometheus.Collector {
	return collector{clients: c.Clients, totals: &c.totals, d: c.descs, rt: c.rt}
}

type collector struct {
	clients func() []ClientInsight
	totals  *totals
	d       descs
	rt      *policy.Runtime // nil: no plugins
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.d.nacks, c.d.responses, c.d.withheld, c.d.clients, c.d.refusals} {
		ch <- d
	}
	if c.rt != nil {
		for _, pc := range c.rt.Collectors() {
			pc.Describe(ch)
		}
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	if c.rt != nil {
		for _, pc := range c.rt.Collectors() {
			pc.Collect(ch)
		}
	}
	t := c.totals
	t.mu.Lock()
	for typeURL, n := range t.nacks {
		ch <- prometheus.MustNewConstMetric(c.d.nacks, prometheus.CounterValue, float64(n), typeURL)
	}
	for typeURL, n := range t.responses {
		ch <- prometheus.MustNewConstMetric(c.d.responses, prometheus.CounterValue, float64(n), typeURL)
	}
	for _, reason := range refusalReasons {
		ch <- prometheus.MustNewConstMetric(c.d.refusals, prometheus.CounterValue, float64(t.refusals[reason]), reason)
	}
	for reason, n := range t.refusals {
		if !slices.Contains(refusalReasons, reason) {
			ch <- prometheus.MustNewConstMetric(c.d.refusals, prometheus.CounterValue, float64(n), reason)
		}
	}
	t.mu.Unlock()
	withheld := map[string]int{}
	clients := c.clients()
	for _, ci := range clients {
		for _, ti := range ci.Types {
			withheld[ti.TypeURL] += len(ti.Withheld)
		}
	}
	for typeURL, n := range withheld {
		ch <- prometheus.MustNewConstMetric(c.d.withheld, prometheus.GaugeValue, float64(n), typeURL)
	}
	ch <- prometheus.MustNewConstMetric(c.d.clients, prometheus.GaugeValue, float64(len(clients)))
}

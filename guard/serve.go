package guard

// What New and NewCache share: the engine they drive (internal/stack), its callbacks, the
// insight and the counts.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/encoding"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/internal/lograte"
	"github.com/kds-host/kds-host/internal/stack"
	"github.com/kds-host/kds-host/policy"
)

// serving is the engine a Guard or a Cache serves from, with the plugins, counts and log it
// keeps for the adopter.
type serving struct {
	s        *stack.Stack
	rt       *policy.Runtime // Options.Plugins'; nil without
	descs    descs
	totals   totals
	refusals *lograte.Log // refused streams, a few lines a second per reason
	closed   sync.Once
	before   func()                 // Close runs it first (New: stops its watches of the wrapped cache)
	list     func() []ClientInsight // Clients, of the Guard or the Cache
	// checkWording: an owner check's hold reads "owner check: ..." (New's), not "WAIT: ..."
	checkWording bool
}

// newServing assembles the engine for types (with limits), and opens opts' plugins.
func newServing(types []string, opts *Options, limits engine.Limits) (_ *serving, err error) {
	rt, err := opts.openPlugins()
	if err != nil {
		return nil, err
	}
	v := &serving{rt: rt, descs: opts.descs(), refusals: lograte.New(opts.Logger, time.Second, 5, "reason")}
	v.s, err = stack.New(stack.Config{Types: types, Logger: opts.Logger, RetryPolicy: opts.RetryPolicy, Fallback: opts.Fallback,
		PolicyTimeout: opts.PolicyTimeout, OwnerCheck: opts.OwnerCheck, OwnerCheckTimeout: opts.OwnerCheckTimeout,
		Observers: []event.Observer{v.counter()}, Limits: limits})
	if err != nil {
		v.refusals.Close()
		if rt != nil {
			rt.Close()
		}
		return nil, err
	}
	if !opts.NoHolds {
		v.s.Cache.SetWithholder(&envoyHolds{warm: map[warmKey]*engine.Entry{}})
	}
	v.s.Cache.OnUnbound(func(err error) {
		v.totals.add(&v.totals.refusals, "unbound")
		v.refusals.Log("unbound", slog.LevelError, "xDS request refused: the server was made without the cache's Callbacks", "error", err)
	})
	return v, nil
}

// Close stops the watches of a wrapped cache, the client expiry, the owner checks, the retry
// decisions in flight, every stream's sender and the plugins. A second Close does nothing.
func (v *serving) Close() {
	v.closed.Do(func() {
		if v.before != nil {
			v.before()
		}
		v.s.Close()
		v.refusals.Close()
		if v.rt != nil {
			v.rt.Close()
		}
	})
}

// CreateWatch implements cache.ConfigWatcher for the state-of-the-world server.
func (v *serving) CreateWatch(req *discovery.DiscoveryRequest, sub cache.Subscription, out chan cache.Response) (func(), error) {
	return v.s.Cache.CreateWatch(req, sub, out)
}

// CreateDeltaWatch implements cache.ConfigWatcher for the delta server.
func (v *serving) CreateDeltaWatch(req *discovery.DeltaDiscoveryRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	return v.s.Cache.CreateDeltaWatch(req, sub, out)
}

// Codec is gRPC's "proto" codec, except that a resource version is encoded once for every
// client that is sent it: give it to the gRPC server, grpc.NewServer(grpc.ForceServerCodecV2(c.Codec())).
func (v *serving) Codec() encoding.CodecV2 { return v.s.Cache.Codec() }

// counter counts NACKs and responses by type, and refused streams by reason (refused).
func (v *serving) counter() event.Observer {
	return event.Observer{
		NACK:    func(n event.NACK) { v.totals.add(&v.totals.nacks, n.TypeURL) },
		Sent:    func(s event.Sent) { v.totals.add(&v.totals.responses, s.TypeURL) },
		Refused: func(r event.Refusal) { v.refused(r.Reason, r.Node, r.Detail) },
	}
}

// clients is every connected client's insight, as client makes it of the engine's node (its
// key, for New) and stream.
func (v *serving) clients(client func(node string, stream int64) ClientInsight) []ClientInsight {
	out := []ClientInsight{}
	for _, z := range v.s.Nodes.Insights() {
		if !z.Connected {
			continue
		}
		ci := client(z.Node, z.Stream)
		held := map[string][]Withheld{}
		if v.s.Holds != nil {
			for _, w := range v.s.Holds.Withheld(z.Node) {
				reason := w.Verdict + ": " + w.Reason
				switch waiting := w.WaitingFor != (engine.Ref{}); {
				case v.checkWording && waiting:
					reason = fmt.Sprintf("owner check: waiting for %s %q", shortType(w.WaitingFor.TypeURL), w.WaitingFor.Name)
				case v.checkWording:
					reason = "owner check: " + reason
				case waiting:
					reason = w.Verdict + ": waiting for " + w.WaitingFor.TypeURL + "/" + w.WaitingFor.Name
				}
				held[w.Key.TypeURL] = append(held[w.Key.TypeURL], Withheld{Name: w.Key.Name, Reason: reason})
			}
		}
		for _, k := range z.Types {
			ti := &TypeInsight{TypeURL: k.TypeURL, Responses: k.Responses, ACKs: k.ACKs, NACKs: k.NACKs, Resent: k.Resent, LastError: k.LastError, Withheld: held[k.TypeURL]}
			for _, h := range k.Holds {
				ti.Withheld = append(ti.Withheld, Withheld{Name: h.Name, Version: h.Version, Reason: h.Reason})
			}
			for _, r := range k.Rejected {
				ti.Withheld = append(ti.Withheld, Withheld{Name: r.Name, Version: r.Version, Reason: "refused by the client: " + r.Reason})
			}
			ci.Types = append(ci.Types, ti)
		}
		slices.SortFunc(ci.Types, func(a, b *TypeInsight) int { return strings.Compare(a.TypeURL, b.TypeURL) })
		out = append(out, ci)
	}
	return out
}

// refused counts a refused stream by reason, and logs it (5 lines a second per reason).
func (v *serving) refused(reason, node, detail string) {
	v.totals.add(&v.totals.refusals, reason)
	v.refusals.Log(reason, slog.LevelWarn, "xDS stream refused", "reason", reason, "node", node, "detail", detail)
}

// ClientInsight is what the guard knows of one client stream, the shape of kds-host's
// /api/zones entries.
type ClientInsight struct {
	// Stream is the server's stream id; Delta says which server's (they number apart).
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
	mu               sync.Mutex // guards nacks, responses and refusals
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
func (v *serving) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		items := v.list()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"items": items, "total": len(items)})
	})
}

// Collector exports the counts to Prometheus (Options.Metrics names them), and the metrics of
// the plugins (Options.Plugins).
func (v *serving) Collector() prometheus.Collector { return collector{v} }

type collector struct{ *serving }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.descs.nacks, c.descs.responses, c.descs.withheld, c.descs.clients, c.descs.refusals} {
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
	t := &c.totals
	t.mu.Lock()
	refusals := map[string]int64{"limit": 0, "invalid": 0} // from the start: an alert's rate misses a series' first event
	maps.Copy(refusals, t.refusals)
	for d, m := range map[*prometheus.Desc]map[string]int64{c.descs.nacks: t.nacks, c.descs.responses: t.responses, c.descs.refusals: refusals} {
		for label, n := range m {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(n), label)
		}
	}
	t.mu.Unlock()
	withheld := map[string]int{}
	clients := c.list()
	for _, ci := range clients {
		for _, ti := range ci.Types {
			withheld[ti.TypeURL] += len(ti.Withheld)
		}
	}
	for typeURL, n := range withheld {
		ch <- prometheus.MustNewConstMetric(c.descs.withheld, prometheus.GaugeValue, float64(n), typeURL)
	}
	ch <- prometheus.MustNewConstMetric(c.descs.clients, prometheus.GaugeValue, float64(len(clients)))
}

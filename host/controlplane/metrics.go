package controlplane

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/host/store"
	"github.com/kds-host/kds-host/host/zone"
	"github.com/kds-host/kds-host/internal/shrink"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// zoneMetrics keeps the counters that /metrics shows with a zone label, and serves them at
// scrape time. A Prometheus vector keeps a map entry for every label value it ever saw, even
// after its series are deleted; here a zone's counters go with the zone (forget), and the map
// is copied smaller once it shrinks, so zones that come and go leave nothing behind.
//
// What every write costs a stream (responses, resources, ACKs, NACKs per kind) is not counted
// here: each zone's session counts it already, and Collect reads it from the zone table
// (insights), so that a write to 10,000 zones does not also count into 10,000 zones' metrics.
type zoneMetrics struct {
	insights func() []engine.NodeInsight // the zone table's, with every kind's counters; nil: none

	mu    sync.RWMutex // guards zones, peak, streams and durable; each zone's counters have their own lock
	zones map[string]*zoneCounts
	peak  shrink.Peak
	// streams counts each zone's streams. Durable, it outlives the zone's other counters
	// (forget), so a zone that comes back after its grace counts on and its flapping shows; a
	// zone's count then goes only when the zone is neither in the zone table nor known to the
	// store (prune). Otherwise it goes with the zone's other counters.
	streams map[string]float64
	durable bool
}

// zoneCounts are one zone's counters.
type zoneCounts struct {
	mu             sync.Mutex // guards the counters: every stream event counts here, so zones do not share a lock
	kinds          map[string]*kindCounts
	reRequests     [2]float64 // answered, limited
	rounds         float64
	fallbacks      float64
	giveUps        float64
	ownerCalls     [2]float64 // ok, error
	ownerFailOpens float64
}

// kindCounts are one zone's counters of one kind.
type kindCounts struct {
	rejected                 map[event.Cause]float64
	resent, parked, released float64
}

func newZoneMetrics() *zoneMetrics {
	return &zoneMetrics{zones: map[string]*zoneCounts{}, streams: map[string]float64{}}
}

// opened counts a stream the zone opened.
func (m *zoneMetrics) opened(zone string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.streams[zone]++
}

// count runs f on zone's counters under their lock. A zone forgotten meanwhile counts into
// counters no longer shown, as it would have a moment before.
func (m *zoneMetrics) count(zone string, f func(z *zoneCounts)) {
	m.mu.RLock()
	z := m.zones[zone]
	m.mu.RUnlock()
	if z == nil {
		m.mu.Lock()
		if z = m.zones[zone]; z == nil {
			z = &zoneCounts{kinds: map[string]*kindCounts{}}
			m.zones[zone] = z
		}
		m.mu.Unlock()
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	f(z)
}

func (z *zoneCounts) kind(kind string) *kindCounts {
	k := z.kinds[kind]
	if k == nil {
		k = &kindCounts{}
		z.kinds[kind] = k
	}
	return k
}

// forget drops a zone's counters; its streams' count too unless the counts are durable.
func (m *zoneMetrics) forget(zone string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.zones, zone)
	m.zones = shrink.Map(m.zones, &m.peak)
	if !m.durable {
		delete(m.streams, zone)
	}
}

// prune drops the streams' count of every zone keep does not keep (durable counts).
func (m *zoneMetrics) prune(keep func(zone string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for zone := range m.streams {
		if !keep(zone) {
			delete(m.streams, zone)
		}
	}
}

// zoneDescs are the metrics zoneMetrics serves, with their labels after "zone".
var zoneDescs = struct {
	streams, responses, resources, acks, nacks, rejected, reRequests           *prometheus.Desc
	rounds, resent, fallbacks, giveUps, parked, released, ownerCalls, failOpen *prometheus.Desc
	// parkedOld is parked under its name before issue 21, emitted beside it for one release.
	parkedOld *prometheus.Desc
}{
	streams: prometheus.NewDesc("kds_zone_streams_total",
		"KDS streams the zone opened to this replica: the first, then one per reconnection (a zone that keeps reconnecting flaps). Kept past the zone's grace for as long as the store knows the zone.", []string{"zone"}, nil),
	responses: prometheus.NewDesc("kds_responses_total", "Delta responses sent to zones.", []string{"zone", "kind"}, nil),
	resources: prometheus.NewDesc("kds_resources_sent_total", "Resources (and removals) sent to zones.", []string{"zone", "kind"}, nil),
	acks:      prometheus.NewDesc("kds_acks_total", "ACKs received from zones.", []string{"zone", "kind"}, nil),
	nacks:     prometheus.NewDesc("kds_nacks_total", "NACKs received from zones.", []string{"zone", "kind"}, nil),
	rejected: prometheus.NewDesc("kds_rejected_resources_total", "Resources named as rejected in NACKs, by the zone's cause.",
		[]string{"zone", "kind", "cause"}, nil),
	reRequests: prometheus.NewDesc("kds_rerequests_total",
		"Zones asking again for names they refused once the cause cleared: answered at once, or refused by the stream's rate limit.", []string{"zone", "result"}, nil),
	rounds:    prometheus.NewDesc("kds_retry_rounds_total", "Retry rounds fired.", []string{"zone"}, nil),
	resent:    prometheus.NewDesc("kds_retry_resent_resources_total", "Rejected resources sent again by retry rounds.", []string{"zone", "kind"}, nil),
	fallbacks: prometheus.NewDesc("kds_retry_policy_fallbacks_total", "Decisions the built-in policy made because the configured policy failed or timed out.", []string{"zone"}, nil),
	giveUps:   prometheus.NewDesc("kds_retry_give_ups_total", "Streams on which the policy gave up.", []string{"zone"}, nil),
	parked: prometheus.NewDesc("kds_retry_parked_resources_total", "Rejected resources the policy parked: not resent until their content changes (an INVALID spec).",
		[]string{"zone", "kind"}, nil),
	parkedOld: prometheus.NewDesc("kds_retry_held_resources_total", "Deprecated: use kds_retry_parked_resources_total (the same counter; this name goes in the next release).",
		[]string{"zone", "kind"}, nil),
	released: prometheus.NewDesc("kds_retry_released_resources_total", "Rejected resources sent again at once because the owner they missed was ACKed.",
		[]string{"zone", "kind"}, nil),
	ownerCalls: prometheus.NewDesc("kds_owner_check_calls_total", "Batched owner-check calls, by zone and result.", []string{"zone", "result"}, nil),
	failOpen:   prometheus.NewDesc("kds_owner_check_fail_open_total", "Pushes sent unchecked because the owner check failed or timed out.", []string{"zone"}, nil),
}

// Describe implements prometheus.Collector.
func (m *zoneMetrics) Describe(ch chan<- *prometheus.Desc) {
	d := zoneDescs
	for _, desc := range []*prometheus.Desc{d.streams, d.responses, d.resources, d.acks, d.nacks, d.rejected, d.reRequests,
		d.rounds, d.resent, d.fallbacks, d.giveUps, d.parked, d.parkedOld, d.released, d.ownerCalls, d.failOpen} {
		ch <- desc
	}
}

// Collect implements prometheus.Collector: every counter of every zone, as it is now.
func (m *zoneMetrics) Collect(ch chan<- prometheus.Metric) {
	d := zoneDescs
	emit := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
	}
	if m.insights != nil {
		for _, zi := range m.insights() {
			for _, ki := range zi.Types {
				emit(d.responses, float64(ki.Responses), zi.Node, ki.TypeURL)
				emit(d.resources, float64(ki.Sent), zi.Node, ki.TypeURL)
				emit(d.acks, float64(ki.ACKs), zi.Node, ki.TypeURL)
				emit(d.nacks, float64(ki.NACKs), zi.Node, ki.TypeURL)
			}
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for zone, n := range m.streams {
		emit(d.streams, n, zone)
	}
	for zone, z := range m.zones {
		z.mu.Lock()
		for kind, k := range z.kinds {
			for cause, n := range k.rejected {
				c := string(cause)
				if c == "" {
					c = "UNSPECIFIED"
				}
				emit(d.rejected, n, zone, kind, c)
			}
			if k.resent > 0 {
				emit(d.resent, k.resent, zone, kind)
			}
			if k.parked > 0 {
				emit(d.parked, k.parked, zone, kind)
				emit(d.parkedOld, k.parked, zone, kind) // deprecated name, kept one release
			}
			if k.released > 0 {
				emit(d.released, k.released, zone, kind)
			}
		}
		emit(d.reRequests, z.reRequests[0], zone, "answered")
		emit(d.reRequests, z.reRequests[1], zone, "limited")
		emit(d.rounds, z.rounds, zone)
		emit(d.fallbacks, z.fallbacks, zone)
		emit(d.giveUps, z.giveUps, zone)
		emit(d.ownerCalls, z.ownerCalls[0], zone, "ok")
		emit(d.ownerCalls, z.ownerCalls[1], zone, "error")
		emit(d.failOpen, z.ownerFailOpens, zone)
		z.mu.Unlock()
	}
}

// refusalReasons are the reasons of kds_stream_refusals_total (event.Refusal's, kds.refusalOf's).
var refusalReasons = []string{"unauthenticated", "permission_denied", "limit", "invalid", "replaced", "other"}

// kdsMetrics counts KDS traffic for Prometheus.
type kdsMetrics struct {
	zones    *zoneMetrics
	streams  prometheus.Gauge
	refused  *prometheus.CounterVec
	ackDelay *prometheus.HistogramVec
	byKind   sync.Map // kind -> ackDelay's observer: an ACK finds its series without the vector's hashing and lock
}

// ackDelayOf is kind's series of kds_response_ack_seconds.
func (m *kdsMetrics) ackDelayOf(kind string) prometheus.Observer {
	if o, ok := m.byKind.Load(kind); ok {
		return o.(prometheus.Observer)
	}
	o := m.ackDelay.WithLabelValues(kind)
	m.byKind.Store(kind, o)
	return o
}

func newKDSMetrics(reg prometheus.Registerer, zones *zoneMetrics) *kdsMetrics {
	m := &kdsMetrics{
		zones:   zones,
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kds_streams", Help: "Open zone streams."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_stream_refusals_total",
			Help: "KDS streams refused (unauthenticated, permission_denied, limit, invalid) or closed because a newer stream of the same zone replaced them (replaced)."}, []string{"reason"}),
		ackDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kds_response_ack_seconds",
			Help:    "Time from a KDS response's send to the zone's ACK of it, by kind (NACKed responses are not counted): the network and the zone's apply.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"kind"}),
	}
	reg.MustRegister(m.streams, m.refused, m.ackDelay)
	// Every reason is exported from the start, at 0: rate and increase miss the first event of a
	// series that appears with it (deploy/prometheus alerts on refusals).
	for _, reason := range refusalReasons {
		m.refused.WithLabelValues(reason)
	}
	return m
}

func (m *kdsMetrics) observer() event.Observer {
	return event.Observer{
		StreamOpened: func(_ int64, zone string) {
			m.streams.Inc()
			m.zones.opened(zone)
		},
		StreamClosed: func(int64, string) { m.streams.Dec() },
		// Responses, resources, ACKs and NACKs are the sessions' counters (zoneMetrics.insights);
		// here each response is timed from its send to its ACK.
		ACK: func(a event.ACK) {
			if !a.Initial && !a.Sent.IsZero() {
				m.ackDelayOf(a.TypeURL).Observe(time.Since(a.Sent).Seconds())
			}
		},
		NACK: func(n event.NACK) {
			m.zones.count(n.Node, func(z *zoneCounts) {
				k := z.kind(n.TypeURL)
				if k.rejected == nil {
					k.rejected = map[event.Cause]float64{}
				}
				for _, r := range n.Rejected {
					k.rejected[r.Cause]++
				}
			})
		},
		Refused: func(r event.Refusal) { m.refused.WithLabelValues(r.Reason).Inc() },
		ReRequest: func(r event.ReRequest) {
			m.zones.count(r.Node, func(z *zoneCounts) {
				if r.Answered {
					z.reRequests[0]++
				} else {
					z.reRequests[1]++
				}
			})
		},
	}
}

// retryMetrics counts what the retry scheduler decides.
type retryMetrics struct {
	zones  *zoneMetrics
	delay  prometheus.Histogram
	policy prometheus.Histogram
	log    hclog.Logger
}

func newRetryMetrics(reg prometheus.Registerer, zones *zoneMetrics, log hclog.Logger) *retryMetrics {
	m := &retryMetrics{
		zones: zones,
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_retry_delay_seconds",
			Help: "Delay before each retry round.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 13)}),
		policy: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_retry_policy_call_seconds",
			Help: "Latency of retry policy decisions, fallback included.", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14)}),
		log: log,
	}
	reg.MustRegister(m.delay, m.policy)
	return m
}

func (m *retryMetrics) hooks() retry.Hooks {
	return retry.Hooks{
		PolicyCall: func(_ string, d time.Duration, _ error) { m.policy.Observe(d.Seconds()) },
		Round: func(zone string, d time.Duration, resent map[string]int) {
			m.delay.Observe(d.Seconds())
			m.zones.count(zone, func(z *zoneCounts) {
				z.rounds++
				for kind, n := range resent {
					z.kind(kind).resent += float64(n)
				}
			})
		},
		Decided: func(zone string, d retry.Decision) {
			if d.GiveUp {
				return // the give-up has its own INFO line
			}
			m.log.Debug("retry decision", "zone", zone, "round", d.Round, "delay", d.Delay, "kinds", d.TypeURLs, "parked", d.Parked, "reason", d.Reason)
		},
		GaveUp: func(zone, reason string) {
			m.zones.count(zone, func(z *zoneCounts) { z.giveUps++ })
			m.log.Info("the retry policy gave up: no more forced resends on this stream until content changes", "zone", zone, "reason", reason)
		},
		Parked: func(zone string, parked []retry.ParkedName) {
			m.zones.count(zone, func(z *zoneCounts) {
				for _, p := range parked {
					z.kind(p.TypeURL).parked++
				}
			})
			for _, h := range parked {
				m.log.Info("rejected resource parked: not resent until its content changes", "zone", zone, "kind", h.TypeURL, "name", h.Name, "reason", h.Reason)
			}
		},
		Released: func(zone string, resent map[string]int) {
			m.zones.count(zone, func(z *zoneCounts) {
				for kind, n := range resent {
					z.kind(kind).released += float64(n)
				}
			})
		},
	}
}

// fallback counts a decision the built-in policy made in the configured policy's place.
func (m *retryMetrics) fallback(req *pluginv1.ScheduleRequest, _ error) {
	m.zones.count(req.GetZone(), func(z *zoneCounts) { z.fallbacks++ })
}

// ownerMetrics counts owner-check decisions.
type ownerMetrics struct {
	zones   *zoneMetrics
	latency prometheus.Histogram
}

func newOwnerMetrics(reg prometheus.Registerer, zones *zoneMetrics) *ownerMetrics {
	m := &ownerMetrics{
		zones: zones,
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_owner_check_call_seconds",
			Help: "Latency of one batched owner-check call.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 15)}),
	}
	reg.MustRegister(m.latency)
	return m
}

func (m *ownerMetrics) hooks() owner.Hooks {
	return owner.Hooks{
		Call: func(zone string, _ int, d time.Duration, err error) {
			m.latency.Observe(d.Seconds())
			m.zones.count(zone, func(z *zoneCounts) {
				if err != nil {
					z.ownerCalls[1]++
				} else {
					z.ownerCalls[0]++
				}
			})
		},
		FailOpen: func(zone string, _ error) { m.zones.count(zone, func(z *zoneCounts) { z.ownerFailOpens++ }) },
	}
}

// withheldCollector reports, at scrape time, what the global withholds (owner holds) per zone,
// kind and verdict: kds_withheld_resources, and the same gauge under its name before issue 21,
// kds_held_resources, deprecated and kept one release.
type withheldCollector struct {
	g             *Global
	desc, descOld *prometheus.Desc
}

func newWithheldCollector(g *Global) withheldCollector {
	labels := []string{"zone", "kind", "verdict"}
	return withheldCollector{g: g,
		desc: prometheus.NewDesc("kds_withheld_resources",
			"Resources the global withholds from a zone by the owner check (owner holds), by verdict.", labels, nil),
		descOld: prometheus.NewDesc("kds_held_resources",
			"Deprecated: use kds_withheld_resources (the same gauge; this name goes in the next release).", labels, nil),
	}
}

func (c withheldCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.descOld
}

func (c withheldCollector) Collect(ch chan<- prometheus.Metric) {
	if c.g.Holds == nil {
		return
	}
	type key struct{ zone, kind, verdict string }
	counts := map[key]int{}
	for _, zone := range c.g.Zones.Connected() {
		for _, h := range c.g.Holds.Withheld(zone) {
			counts[key{zone, h.Key.TypeURL, h.Verdict}]++ // kds-host's type URL is the kind
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.zone, k.kind, k.verdict)
		ch <- prometheus.MustNewConstMetric(c.descOld, prometheus.GaugeValue, float64(n), k.zone, k.kind, k.verdict)
	}
}

// zoneConnections reports, at scrape time, every zone this replica knows: kds_zone_connected is
// 1 while the zone has a stream open here, and 0 while it has none: within its grace
// (--zone-grace) from the zone table, and after it while the store knows the zone and no other
// replica serves it. A zone served by another replica is that replica's series.
type zoneConnections struct {
	list func() []engine.NodeInsight
	// known is the zones the store knows (nil: none); elsewhere, those another replica serves.
	known     func() map[string]bool
	elsewhere func() map[string]bool
}

var zoneConnectedDesc = prometheus.NewDesc("kds_zone_connected",
	"1 while the zone has a KDS stream open to this replica; 0 while it has none, within its grace (--zone-grace) and after it for as long as the store knows the zone (every zone a replica served, until DELETE /api/zones/{zone}) and no other replica serves it.",
	[]string{"zone"}, nil)

func (c zoneConnections) Describe(ch chan<- *prometheus.Desc) { ch <- zoneConnectedDesc }

func (c zoneConnections) Collect(ch chan<- prometheus.Metric) {
	list := c.list()
	inTable := make(map[string]bool, len(list))
	for _, zi := range list {
		inTable[zi.Node] = true
		v := 0.0
		if zi.Connected {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(zoneConnectedDesc, prometheus.GaugeValue, v, zi.Node)
	}
	if c.known == nil {
		return
	}
	known := c.known()
	if len(known) == 0 {
		return
	}
	elsewhere := c.elsewhere()
	for zone := range known {
		if !inTable[zone] && !elsewhere[zone] {
			ch <- prometheus.MustNewConstMetric(zoneConnectedDesc, prometheus.GaugeValue, 0, zone)
		}
	}
}

// storeCollector reports whether the store answers (kds_store_up, kds_store_probe_age_seconds:
// the last answer of the store probe, which runs on its own schedule, so a scrape never waits on
// the store) and, for a store that hears other processes' writes over a LISTEN connection
// (PostgreSQL), whether that connection is up, how often it was made, and how its ChangesSince
// were answered.
type storeCollector struct {
	st    store.Store
	probe *storeProbe
}

var storeDescs = struct{ up, probeAge, listenUp, listenConnects, changes, relay *prometheus.Desc }{
	up: prometheus.NewDesc("kds_store_up",
		"1 when the store's last probe (every --store-probe-interval, the check /readyz reports) read its revision within 2s and found room to write; 0 when it did not, when its writes fail for lack of space, or while a probe has waited longer than 2s. Absent until the first probe answers.", nil, nil),
	probeAge: prometheus.NewDesc("kds_store_probe_age_seconds",
		"Seconds since the store probe's last answer (kds_store_up); while a probe waits past its 2s deadline, since that probe began.", nil, nil),
	listenUp: prometheus.NewDesc("kds_store_listen_up",
		"1 while the store hears other replicas' writes at once (by its PostgreSQL LISTEN connection, or from the changes relay's hub), 0 while it cannot and polls the revision instead. PostgreSQL stores only.", nil, nil),
	listenConnects: prometheus.NewDesc("kds_store_listen_connects_total",
		"Connections the store made to PostgreSQL to hear other replicas' writes (the first, then one after each loss). PostgreSQL stores only.", nil, nil),
	changes: prometheus.NewDesc("kds_store_changes_total",
		"The store's answers to what changed since a revision (one per snapshot update and poll), by source: log (the changes carried by the writes' notifications, no database read) or query (read from the database: a write too large to carry, one missed while the LISTEN connection was down, a replica just started). PostgreSQL stores only.",
		[]string{"source"}, nil),
	relay: prometheus.NewDesc("kds_store_relay",
		"1 for this replica's part in the changes relay, 0 for the other: hub (its LISTEN hears writes for every replica that follows it) or follower (it hears writes from the hub, without a LISTEN of its own); both 0 while it listens alone (no relay, or no hub it can follow: see the relay's errors in the log). PostgreSQL stores only.",
		[]string{"role"}, nil),
}

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- storeDescs.up
	ch <- storeDescs.probeAge
	ch <- storeDescs.listenUp
	ch <- storeDescs.listenConnects
	ch <- storeDescs.changes
	ch <- storeDescs.relay
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	if c.st == nil {
		return
	}
	if a := c.probe.last(); a.answered {
		up := 1.0
		if a.err != nil {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(storeDescs.up, prometheus.GaugeValue, up)
		ch <- prometheus.MustNewConstMetric(storeDescs.probeAge, prometheus.GaugeValue, a.age.Seconds())
	}
	l, ok := c.st.(store.Listener)
	if !ok {
		return
	}
	s := l.ListenStatus()
	if !s.Enabled {
		return
	}
	listening := 0.0
	if s.Listening {
		listening = 1
	}
	ch <- prometheus.MustNewConstMetric(storeDescs.listenUp, prometheus.GaugeValue, listening)
	ch <- prometheus.MustNewConstMetric(storeDescs.listenConnects, prometheus.CounterValue, float64(s.Connects))
	ch <- prometheus.MustNewConstMetric(storeDescs.changes, prometheus.CounterValue, float64(s.ChangesFromLog), "log")
	ch <- prometheus.MustNewConstMetric(storeDescs.changes, prometheus.CounterValue, float64(s.ChangesQueried), "query")
	for _, role := range []string{store.RelayHub, store.RelayFollower} {
		v := 0.0
		if s.Relay == role {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(storeDescs.relay, prometheus.GaugeValue, v, role)
	}
}

// newSnapshotUpdateSeconds is the histogram of the global's snapshot updates (Global.sync).
func newSnapshotUpdateSeconds(reg prometheus.Registerer) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_snapshot_update_seconds",
		Help:    "Time from a store change to the new KDS snapshot handed to every zone stream: reading what changed, building the snapshot, marking each stream's changed names (full rebuilds included; polls that find nothing new are not counted).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	reg.MustRegister(h)
	return h
}

// zoneClientCollector reports, at scrape time, a zone's KDS client: its connection to the global
// and what it received and refused (zone.Client.Stats), with the zone's name as a label so that
// its series join the global's.
type zoneClientCollector struct {
	zone  string
	stats func() zone.Stats
}

var zoneClientDescs = struct{ connected, blocked, streams, responses, acks, nacks, reRequests *prometheus.Desc }{
	connected: prometheus.NewDesc("kds_zone_client_connected",
		"1 while this zone's KDS stream to its global is up, 0 while it is not.", []string{"zone"}, nil),
	blocked: prometheus.NewDesc("kds_zone_client_blocked",
		"1 while the zone does not sync because its global serves another store than the zone synced from (see GET /api/zone's blocked), else 0.", []string{"zone"}, nil),
	streams: prometheus.NewDesc("kds_zone_client_streams_total",
		"KDS streams to the global that got as far as the global's first answer (the first, then one after each reconnection).", []string{"zone"}, nil),
	responses: prometheus.NewDesc("kds_zone_client_responses_total", "KDS responses the zone received.", []string{"zone"}, nil),
	acks:      prometheus.NewDesc("kds_zone_client_acks_total", "Responses the zone ACKed.", []string{"zone"}, nil),
	nacks: prometheus.NewDesc("kds_zone_client_nacks_total",
		"Responses the zone NACKed (refused some or all of); by kind on the global, kds_nacks_total.", []string{"zone"}, nil),
	reRequests: prometheus.NewDesc("kds_zone_client_rerequests_total",
		"Times the zone asked its global again for names it had refused, once their cause cleared.", []string{"zone"}, nil),
}

func (c zoneClientCollector) Describe(ch chan<- *prometheus.Desc) {
	d := zoneClientDescs
	for _, desc := range []*prometheus.Desc{d.connected, d.blocked, d.streams, d.responses, d.acks, d.nacks, d.reRequests} {
		ch <- desc
	}
}

func (c zoneClientCollector) Collect(ch chan<- prometheus.Metric) {
	d, s := zoneClientDescs, c.stats()
	bit := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(d.connected, prometheus.GaugeValue, bit(s.Connected), c.zone)
	ch <- prometheus.MustNewConstMetric(d.blocked, prometheus.GaugeValue, bit(s.Blocked != ""), c.zone)
	ch <- prometheus.MustNewConstMetric(d.streams, prometheus.CounterValue, float64(s.Sessions), c.zone)
	ch <- prometheus.MustNewConstMetric(d.responses, prometheus.CounterValue, float64(s.Responses), c.zone)
	ch <- prometheus.MustNewConstMetric(d.acks, prometheus.CounterValue, float64(s.ACKs), c.zone)
	ch <- prometheus.MustNewConstMetric(d.nacks, prometheus.CounterValue, float64(s.NACKs), c.zone)
	ch <- prometheus.MustNewConstMetric(d.reRequests, prometheus.CounterValue, float64(s.ReRequests), c.zone)
}

// newZoneApplySeconds is the histogram of the time a zone takes to store one response.
func newZoneApplySeconds(reg prometheus.Registerer, zone string) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_zone_client_apply_seconds",
		Help:        "Time the zone took to apply one KDS response (decode, one store transaction) before its ACK or NACK.",
		ConstLabels: prometheus.Labels{"zone": zone}, Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	reg.MustRegister(h)
	return h
}

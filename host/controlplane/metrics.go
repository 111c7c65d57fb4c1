package controlplane

import (
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/owner"
	"github.com/kds-host/kds-host/host/retry"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// kdsMetrics counts KDS traffic for Prometheus.
type kdsMetrics struct {
	streams   prometheus.Gauge
	responses *prometheus.CounterVec
	resources *prometheus.CounterVec
	acks      *prometheus.CounterVec
	nacks     *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	again     *prometheus.CounterVec
	refused   *prometheus.CounterVec
}

func (m *kdsMetrics) perZone() []zoneSeries {
	return []zoneSeries{m.responses, m.resources, m.acks, m.nacks, m.rejected, m.again}
}

// zoneSeries is a metric vector with a "zone" label, whose series are deleted when the zone's
// state is freed, so that zones that come and go do not grow /metrics for ever.
type zoneSeries interface {
	DeletePartialMatch(labels prometheus.Labels) int
}

// forgetZone deletes every series of zone.
func forgetZone(series []zoneSeries, zone string) {
	for _, s := range series {
		s.DeletePartialMatch(prometheus.Labels{"zone": zone})
	}
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func newKDSMetrics(reg prometheus.Registerer) *kdsMetrics {
	m := &kdsMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kds_streams", Help: "Open zone streams."}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_responses_total",
			Help: "Delta responses sent to zones."}, []string{"zone", "kind"}),
		resources: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_resources_sent_total",
			Help: "Resources (and removals) sent to zones."}, []string{"zone", "kind"}),
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_acks_total",
			Help: "ACKs received from zones."}, []string{"zone", "kind"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_nacks_total",
			Help: "NACKs received from zones."}, []string{"zone", "kind"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_rejected_resources_total",
			Help: "Resources named as rejected in NACKs, by the zone's cause."}, []string{"zone", "kind", "cause"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_stream_refusals_total",
			Help: "KDS streams refused (unauthenticated, permission_denied, limit, invalid) or closed because a newer stream of the same zone replaced them (replaced)."}, []string{"reason"}),
		again: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_rerequests_total",
			Help: "Zones asking again for names they refused once the cause cleared: answered at once, or refused by the stream's rate limit."}, []string{"zone", "result"}),
	}
	reg.MustRegister(m.streams, m.responses, m.resources, m.acks, m.nacks, m.rejected, m.again, m.refused)
	return m
}

func (m *kdsMetrics) observer() event.Observer {
	return event.Observer{
		StreamOpened: func(int64, string) { m.streams.Inc() },
		StreamClosed: func(int64, string) { m.streams.Dec() },
		Sent: func(s event.Sent) {
			m.responses.WithLabelValues(s.Zone, s.Kind).Inc()
			m.resources.WithLabelValues(s.Zone, s.Kind).Add(float64(len(s.Versions) + len(s.Removed)))
		},
		ACK: func(a event.ACK) {
			if !a.Initial {
				m.acks.WithLabelValues(a.Zone, a.Kind).Inc()
			}
		},
		NACK: func(n event.NACK) {
			m.nacks.WithLabelValues(n.Zone, n.Kind).Inc()
			for _, r := range n.Rejected {
				cause := string(r.Cause)
				if cause == "" {
					cause = "UNSPECIFIED"
				}
				m.rejected.WithLabelValues(n.Zone, n.Kind, cause).Inc()
			}
		},
		Refused: func(r event.Refusal) { m.refused.WithLabelValues(r.Reason).Inc() },
		ReRequest: func(r event.ReRequest) {
			result := "answered"
			if !r.Answered {
				result = "limited"
			}
			m.again.WithLabelValues(r.Zone, result).Inc()
		},
	}
}

// retryMetrics counts what the retry scheduler decides.
type retryMetrics struct {
	rounds    *prometheus.CounterVec
	resent    *prometheus.CounterVec
	delay     *prometheus.HistogramVec
	policy    *prometheus.HistogramVec
	fallbacks *prometheus.CounterVec
	giveUps   *prometheus.CounterVec
	held      *prometheus.CounterVec
	released  *prometheus.CounterVec
	log       hclog.Logger
}

func (m *retryMetrics) perZone() []zoneSeries {
	return []zoneSeries{m.rounds, m.resent, m.delay, m.policy, m.fallbacks, m.giveUps, m.held, m.released}
}

func newRetryMetrics(reg prometheus.Registerer, log hclog.Logger) *retryMetrics {
	m := &retryMetrics{
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_retry_rounds_total",
			Help: "Retry rounds fired."}, []string{"zone"}),
		resent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_retry_resent_resources_total",
			Help: "Rejected resources sent again by retry rounds."}, []string{"zone", "kind"}),
		delay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kds_retry_delay_seconds",
			Help: "Delay before each retry round.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 13)}, []string{"zone"}),
		policy: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kds_retry_policy_call_seconds",
			Help: "Latency of retry policy decisions, fallback included.", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14)}, []string{"zone"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_retry_policy_fallbacks_total",
			Help: "Decisions the built-in policy made because the configured policy failed or timed out."}, []string{"zone"}),
		giveUps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_retry_give_ups_total",
			Help: "Streams on which the policy gave up."}, []string{"zone"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_retry_held_resources_total",
			Help: "Rejected resources the policy holds back until their content changes (an INVALID spec)."}, []string{"zone", "kind"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_retry_released_resources_total",
			Help: "Rejected resources sent again at once because the owner they missed was ACKed."}, []string{"zone", "kind"}),
		log: log,
	}
	reg.MustRegister(m.rounds, m.resent, m.delay, m.policy, m.fallbacks, m.giveUps, m.held, m.released)
	return m
}

func (m *retryMetrics) hooks() retry.Hooks {
	return retry.Hooks{
		PolicyCall: func(zone string, d time.Duration, _ error) {
			m.policy.WithLabelValues(zone).Observe(d.Seconds())
		},
		Round: func(zone string, d time.Duration, resent map[string]int) {
			m.rounds.WithLabelValues(zone).Inc()
			m.delay.WithLabelValues(zone).Observe(d.Seconds())
			for kind, n := range resent {
				m.resent.WithLabelValues(zone, kind).Add(float64(n))
			}
		},
		GaveUp: func(zone, reason string) {
			m.giveUps.WithLabelValues(zone).Inc()
			m.log.Info("the retry policy gave up: no more forced resends on this stream until content changes", "zone", zone, "reason", reason)
		},
		Held: func(zone string, held []retry.HeldName) {
			for _, h := range held {
				m.held.WithLabelValues(zone, h.Kind).Inc()
				m.log.Info("rejected resource held until its content changes", "zone", zone, "kind", h.Kind, "name", h.Name, "reason", h.Reason)
			}
		},
		Released: func(zone string, resent map[string]int) {
			for kind, n := range resent {
				m.released.WithLabelValues(zone, kind).Add(float64(n))
			}
		},
	}
}

// fallback counts a decision the built-in policy made in the configured policy's place.
func (m *retryMetrics) fallback(req *pluginv1.ScheduleRequest, _ error) {
	m.fallbacks.WithLabelValues(req.GetZone()).Inc()
}

// ownerMetrics counts owner-check decisions.
type ownerMetrics struct {
	calls    *prometheus.CounterVec
	latency  prometheus.Histogram
	failOpen *prometheus.CounterVec
}

func (m *ownerMetrics) perZone() []zoneSeries { return []zoneSeries{m.calls, m.failOpen} }

func newOwnerMetrics(reg prometheus.Registerer) *ownerMetrics {
	m := &ownerMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_owner_check_calls_total",
			Help: "Batched owner-check calls, by zone and result."}, []string{"zone", "result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_owner_check_call_seconds",
			Help: "Latency of one batched owner-check call.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 15)}),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_owner_check_fail_open_total",
			Help: "Pushes sent unchecked because the owner check failed or timed out."}, []string{"zone"}),
	}
	reg.MustRegister(m.calls, m.latency, m.failOpen)
	return m
}

func (m *ownerMetrics) hooks() owner.Hooks {
	return owner.Hooks{
		Call: func(zone string, _ int, d time.Duration, err error) {
			result := "ok"
			if err != nil {
				result = "error"
			}
			m.calls.WithLabelValues(zone, result).Inc()
			m.latency.Observe(d.Seconds())
		},
		FailOpen: func(zone string, _ error) { m.failOpen.WithLabelValues(zone).Inc() },
	}
}

// heldCollector reports, at scrape time, what is held back per zone, kind and verdict.
type heldCollector struct {
	g    *Global
	desc *prometheus.Desc
}

func (c heldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c heldCollector) Collect(ch chan<- prometheus.Metric) {
	if c.g.Holds == nil {
		return
	}
	type key struct{ zone, kind, verdict string }
	counts := map[key]int{}
	for _, zone := range c.g.Zones.Connected() {
		for _, h := range c.g.Holds.Held(zone) {
			counts[key{zone, h.Key.Kind, h.Verdict}]++
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.zone, k.kind, k.verdict)
	}
}

package policy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the runtime's Prometheus collectors. Each Runtime has its own, registered by
// whoever serves them (see Runtime.Collectors).
type metrics struct {
	calls    *prometheus.CounterVec
	errors   *prometheus.CounterVec
	timeouts *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	restarts *prometheus.CounterVec
	reloads  *prometheus.CounterVec
	up       *upCollector

	logDropped *prometheus.CounterVec
}

func newMetrics(status func() []Status) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_plugin_calls_total",
			Help: "Calls to plugins, by plugin name (builtin for the in-process policies) and method."}, []string{"plugin", "method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_plugin_call_errors_total",
			Help: "Plugin calls that failed, timeouts and calls refused while the plugin was down included."}, []string{"plugin", "method"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_plugin_call_timeouts_total",
			Help: "Plugin calls that missed their deadline."}, []string{"plugin", "method"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kds_plugin_call_seconds",
			Help: "Latency of plugin calls.", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14)}, []string{"plugin", "method"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_plugin_restarts_total",
			Help: "Plugin processes started again after one exited or hung."}, []string{"plugin"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_plugin_reloads_total",
			Help: "Plugin reloads (SIGHUP, POST /api/plugins/reload), by result: ok or error."}, []string{"result"}),
		logDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_plugin_log_lines_dropped_total",
			Help: "Log lines of a plugin not relayed to the host's log, over its rate limit (plugin: the binary's file name, which names its log)."}, []string{"plugin"}),
		up: &upCollector{status: status, desc: prometheus.NewDesc("kds_plugin_up",
			"1 when the plugin answers calls (running, or builtin), 0 while it is down.", []string{"plugin"}, nil)},
	}
	// Every result is exported from the start, at 0: rate and increase miss the first event of
	// a series that appears with it (deploy/prometheus alerts on reload errors).
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.errors, m.timeouts, m.seconds, m.restarts, m.reloads, m.up, m.logDropped}
}

// call counts one call to plugin's method.
func (m *metrics) call(plugin, method string, d time.Duration, failed, timedOut bool) {
	m.calls.WithLabelValues(plugin, method).Inc()
	m.seconds.WithLabelValues(plugin, method).Observe(d.Seconds())
	// Errors and timeouts are exported beside the calls, at 0 until the first: an error ratio
	// has both sides, and the first error counts in a rate (deploy/prometheus).
	failures, timeouts := m.errors.WithLabelValues(plugin, method), m.timeouts.WithLabelValues(plugin, method)
	if failed {
		failures.Inc()
	}
	if timedOut {
		timeouts.Inc()
	}
}

// started exports plugin's restarts at 0 from its first start on, so that the first restart
// counts in a rate or increase.
func (m *metrics) started(plugin string) { m.restarts.WithLabelValues(plugin) }

// upCollector reports kds_plugin_up from the runtime's status at scrape time, so a swap of two
// plugins of the same name never shows a stale value.
type upCollector struct {
	status func() []Status
	desc   *prometheus.Desc
}

func (c *upCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *upCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.status() {
		v := 0.0
		if s.State == StateRunning || s.State == StateBuiltin {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, s.Name)
	}
}

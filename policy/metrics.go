package policy

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultNamespace is the namespace of the runtime's metrics when Metrics.Namespace is empty.
const DefaultNamespace = "xds_guard"

// Metrics name the runtime's Prometheus metrics: <Namespace>_plugin_calls_total and so on, each
// with ConstLabels, so that two runtimes can share a registry.
type Metrics struct {
	// Namespace is the metrics' prefix (default DefaultNamespace; kds-host's is "kds").
	Namespace string
	// ConstLabels are labels every metric of the runtime carries, e.g. {"server": "edge"}.
	// "plugin", "method" and "result" are the runtime's own.
	ConstLabels prometheus.Labels
}

// ownLabels are the labels of the runtime's metrics.
var ownLabels = []string{"plugin", "method", "result"}

var (
	metricPrefix = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName    = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// validate says what is wrong with m, naming the field.
func (m Metrics) validate() error {
	if m.Namespace != "" && !metricPrefix.MatchString(m.Namespace) {
		return fmt.Errorf("Metrics.Namespace %q: want a Prometheus metric name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*)", m.Namespace)
	}
	for _, k := range slices.Sorted(maps.Keys(m.ConstLabels)) {
		switch {
		case !labelName.MatchString(k) || strings.HasPrefix(k, "__"):
			return fmt.Errorf("Metrics.ConstLabels: %q is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not __)", k)
		case slices.Contains(ownLabels, k):
			return fmt.Errorf("Metrics.ConstLabels: %q is a label of the runtime's own metrics (%s)", k, strings.Join(ownLabels, ", "))
		}
	}
	return nil
}

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

	logDropped     *prometheus.CounterVec
	logDroppedName string // its full name, for the log
}

// newMetrics makes the collectors named by o (valid, see Metrics.validate).
func newMetrics(o Metrics, status func() []Status) *metrics {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.Namespace, Subsystem: "plugin", Name: name,
			Help: help, ConstLabels: o.ConstLabels}, labels)
	}
	m := &metrics{
		calls:    counter("calls_total", "Calls to plugins, by plugin name (builtin for the in-process policies) and method.", "plugin", "method"),
		errors:   counter("call_errors_total", "Plugin calls that failed, timeouts and calls refused while the plugin was down included.", "plugin", "method"),
		timeouts: counter("call_timeouts_total", "Plugin calls that missed their deadline.", "plugin", "method"),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.Namespace, Subsystem: "plugin", Name: "call_seconds",
			Help: "Latency of plugin calls.", ConstLabels: o.ConstLabels, Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14)}, []string{"plugin", "method"}),
		restarts: counter("restarts_total", "Plugin processes started again after one exited or hung.", "plugin"),
		reloads:  counter("reloads_total", "Plugin reloads (Runtime.Reload), by result: ok or error.", "result"),
		logDropped: counter("log_lines_dropped_total",
			"Log lines of a plugin not relayed to the host's log, over its rate limit (plugin: the binary's file name, which names its log).", "plugin"),
		logDroppedName: prometheus.BuildFQName(o.Namespace, "plugin", "log_lines_dropped_total"),
		up: &upCollector{status: status, desc: prometheus.NewDesc(prometheus.BuildFQName(o.Namespace, "plugin", "up"),
			"1 when the plugin answers calls (running, or builtin), 0 while it is down.", []string{"plugin"}, o.ConstLabels)},
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

// upCollector reports <namespace>_plugin_up from the runtime's status at scrape time, so a swap of two
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

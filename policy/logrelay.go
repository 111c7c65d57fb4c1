package policy

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// logBudget is the state of one plugin's log rate limit, with time passed in: a token bucket
// that refills at rate tokens a second up to burst, and the count of lines dropped since the
// last summary. It does no I/O and reads no clock; logRelay drives it.
type logBudget struct {
	rate, burst float64
	tokens      float64
	last        time.Time // when tokens was last brought up to date; zero: never, the bucket is full
	dropped     int       // lines dropped since the last summary
	since       time.Time // when the first of them was dropped
}

// admit takes a token for a line at now: pass says whether the line goes to the log. A line
// that does not pass is counted for the next summary; first says it is the first since the
// last summary, which is then due one summary interval later.
func (b *logBudget) admit(now time.Time) (pass, first bool) {
	switch {
	case b.last.IsZero():
		b.tokens, b.last = b.burst, now
	case now.After(b.last):
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, false
	}
	b.dropped++
	if b.dropped == 1 {
		b.since = now
		return false, true
	}
	return false, false
}

// summary returns the lines dropped since the last summary and when the first of them was,
// and starts the count again.
func (b *logBudget) summary() (dropped int, since time.Time) {
	dropped, since = b.dropped, b.since
	b.dropped, b.since = 0, time.Time{}
	return dropped, since
}

// logRelay bounds how many log lines of one plugin reach the host's log: rate lines a second,
// burst at once. Each line over the bound is counted in kds_plugin_log_lines_dropped_total, and
// the drops are summarised in the host's log at most once per summary interval: the first drop
// after a summary schedules the next one, interval later. close says what is left at once. So
// no line is dropped unsaid, and a plugin that floods its log costs the host's log at most
// rate lines a second plus a line per interval.
//
// One relay serves every process of one plugin binary in a generation (restarts included, so a
// plugin that crashes in a loop does not get a fresh burst each time). Its only goroutine is a
// summary's timer, which close stops or waits for.
type logRelay struct {
	name     string // the plugin binary's file name, as go-plugin names its logger
	log      hclog.Logger
	dropped  prometheus.Counter
	rate     float64
	burst    int
	interval time.Duration

	mu      sync.Mutex // guards budget, timer and closed
	budget  logBudget
	timer   *time.Timer // the summary due, if any
	closed  bool
	pending sync.WaitGroup // a summary timer that has not fired, or is running
}

// newLogRelay is the relay of the plugin binary name, with cfg's bounds; summaries go to log.
func newLogRelay(name string, cfg *Config, log hclog.Logger, m *metrics) *logRelay {
	return &logRelay{
		name: name, log: log, dropped: m.logDropped.WithLabelValues(name),
		rate: cfg.LogRate, burst: cfg.LogBurst, interval: cfg.LogSummaryInterval,
		budget: logBudget{rate: cfg.LogRate, burst: float64(cfg.LogBurst)},
	}
}

// admit says whether a line of the plugin's goes to the host's log now, and counts it when it
// does not.
func (r *logRelay) admit() bool {
	r.mu.Lock()
	pass, first := r.budget.admit(time.Now())
	if first && !r.closed {
		r.pending.Add(1)
		r.timer = time.AfterFunc(r.interval, r.summarise)
	}
	r.mu.Unlock()
	if !pass {
		r.dropped.Inc()
	}
	return pass
}

// summarise logs the lines dropped since the last summary: the timer's function.
func (r *logRelay) summarise() {
	defer r.pending.Done()
	r.mu.Lock()
	n, _ := r.budget.summary()
	r.timer = nil
	r.mu.Unlock()
	r.report(n, r.interval)
}

// close logs at once what is not yet summarised, and stops the summary timer. Call it when no
// process of the plugin is left to write a line; a line after it is still bounded and counted,
// but never summarised.
func (r *logRelay) close() {
	r.mu.Lock()
	r.closed = true
	if r.timer != nil && r.timer.Stop() {
		r.pending.Done()
	}
	r.timer = nil
	n, since := r.budget.summary()
	r.mu.Unlock()
	r.pending.Wait()
	r.report(n, time.Since(since).Round(time.Millisecond))
}

func (r *logRelay) report(n int, window time.Duration) {
	if n == 0 {
		return
	}
	r.log.Warn(fmt.Sprintf("plugin %s: %d log lines dropped in the last %s (rate limit %g/s, burst %d)", r.name, n, window, r.rate, r.burst),
		"plugin", r.name, "dropped", n, "metric", "kds_plugin_log_lines_dropped_total")
}

// logger is the logger to hand go-plugin for the plugin: go-plugin's own messages pass as they
// are, and the plugin's log lines, which go-plugin logs through Named(binary name), go through
// the relay.
func (r *logRelay) logger(host hclog.Logger) hclog.Logger {
	return &relayLogger{Logger: host, relay: r}
}

// relayLogger is an hclog.Logger whose sub-loggers (Named, ResetNamed, With) send each line
// through a logRelay. A line the underlying logger would not emit at its level costs nothing.
// StandardLogger and StandardWriter are not bounded: go-plugin uses them only for yamux, with a
// gRPC broker multiplex that kds-host does not enable.
type relayLogger struct {
	hclog.Logger
	relay   *logRelay
	limited bool // false: go-plugin's own messages, which pass
}

func (l *relayLogger) Log(level hclog.Level, msg string, args ...any) {
	if l.limited {
		if !enabled(l.Logger, level) || !l.relay.admit() {
			return
		}
		args = withoutRelayTimestamp(args)
	}
	l.Logger.Log(level, msg, args...)
}

// withoutRelayTimestamp drops the field go-plugin adds last to every JSON log line of a plugin
// it relays: "timestamp", the line's @timestamp (year 1 when it had none). The host's line
// carries its own time (its @timestamp, or the start of a text line), so the field would only
// say it twice. A "timestamp" field of the plugin's own comes earlier and stays.
func withoutRelayTimestamp(args []any) []any {
	if n := len(args); n >= 2 && args[n-2] == "timestamp" {
		return args[:n-2]
	}
	return args
}

func (l *relayLogger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l *relayLogger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l *relayLogger) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l *relayLogger) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *relayLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *relayLogger) Named(name string) hclog.Logger {
	return &relayLogger{Logger: l.Logger.Named(name), relay: l.relay, limited: true}
}

func (l *relayLogger) ResetNamed(name string) hclog.Logger {
	return &relayLogger{Logger: l.Logger.ResetNamed(name), relay: l.relay, limited: true}
}

func (l *relayLogger) With(args ...any) hclog.Logger {
	return &relayLogger{Logger: l.Logger.With(args...), relay: l.relay, limited: l.limited}
}

// enabled reports whether l emits a line at level.
func enabled(l hclog.Logger, level hclog.Level) bool {
	switch level {
	case hclog.Trace:
		return l.IsTrace()
	case hclog.Debug:
		return l.IsDebug()
	case hclog.Info:
		return l.IsInfo()
	case hclog.Warn:
		return l.IsWarn()
	case hclog.Error:
		return l.IsError()
	}
	return true
}

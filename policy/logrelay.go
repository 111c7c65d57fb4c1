package policy

import (
	"fmt"
	"log/slog"
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
// burst at once. Each line over the bound is counted in <namespace>_plugin_log_lines_dropped_total,
// and the drops are summarised in the host's log at most once per summary interval: the first drop
// after a summary schedules the next one, interval later. close says what is left at once. So
// no line is dropped unsaid, and a plugin that floods its log costs the host's log at most
// rate lines a second plus a line per interval.
//
// One relay serves every process of one plugin binary in a generation (restarts included, so a
// plugin that crashes in a loop does not get a fresh burst each time). Its only goroutine is a
// summary's timer, which close stops or waits for.
type logRelay struct {
	name     string       // the plugin binary's file name, as go-plugin names its logger
	base     *slog.Logger // the runtime's Options.Logger, which the plugin's lines go to
	log      *slog.Logger // the runtime's own log, which the summaries go to
	metric   string       // the name of the dropped lines' counter, for the summaries
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

// newLogRelay is the relay of the plugin binary name, with o's bounds: the plugin's lines go to
// o.Logger, the summaries to the runtime's log.
func newLogRelay(name string, o *Options, m *metrics) *logRelay {
	return &logRelay{
		name: name, base: o.Logger, log: o.Logger.With(LoggerKey, runtimeName),
		metric: m.logDroppedName, dropped: m.logDropped.WithLabelValues(name),
		rate: o.LogRate, burst: o.LogBurst, interval: o.LogSummaryInterval,
		budget: logBudget{rate: o.LogRate, burst: float64(o.LogBurst)},
	}
}

// logger is the hclog.Logger to hand go-plugin for the plugin (see goPluginLogger).
func (r *logRelay) logger() hclog.Logger { return newGoPluginLogger(r.base, r) }

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
		"plugin", r.name, "dropped", n, "metric", r.metric)
}

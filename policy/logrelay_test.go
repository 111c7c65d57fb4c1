package policy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/internal/hclogslog"
)

func TestLogBudget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type line struct {
		at          time.Duration // after t0
		pass, first bool
	}
	for _, tc := range []struct {
		name        string
		rate, burst float64
		lines       []line
		dropped     int // left for the summary
	}{
		{"the burst passes, then the first drop says so once", 1, 2, []line{
			{0, true, false}, {0, true, false}, {0, false, true}, {0, false, false},
		}, 2},
		{"tokens come back at the rate", 2, 1, []line{
			{0, true, false}, {0, false, true},
			{250 * time.Millisecond, false, false}, // half a token
			{500 * time.Millisecond, true, false},  // one
			{500 * time.Millisecond, false, false},
		}, 3},
		{"an idle plugin gets the burst back, no more", 10, 2, []line{
			{0, true, false}, {0, true, false}, {0, false, true},
			{time.Hour, true, false}, {time.Hour, true, false}, {time.Hour, false, false},
		}, 2},
		{"a clock that goes back adds nothing", 1, 1, []line{
			{time.Second, true, false}, {0, false, true}, {time.Second, false, false},
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			b := logBudget{rate: tc.rate, burst: tc.burst}
			for i, l := range tc.lines {
				pass, first := b.admit(t0.Add(l.at))
				g.Expect([]bool{pass, first}).To(Equal([]bool{l.pass, l.first}), "line %d at %s", i, l.at)
			}
			n, _ := b.summary()
			g.Expect(n).To(Equal(tc.dropped))
			n, since := b.summary()
			g.Expect(n).To(BeZero(), "a summary starts the count again")
			g.Expect(since.IsZero()).To(BeTrue())
		})
	}
}

// relayFixture is a relay of plugin "chatty" whose summaries and relayed lines go to one JSON
// log at Info.
type relayFixture struct {
	relay *logRelay
	m     *metrics
	out   *lockedBuffer
}

func newRelayFixture(rate float64, burst int, interval time.Duration) *relayFixture {
	out := &lockedBuffer{}
	host := hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info, JSONFormat: true})
	m := newMetrics(Metrics{}, func() []Status { return nil })
	o := &Options{Logger: slog.New(hclogslog.New(host)), LogRate: rate, LogBurst: burst, LogSummaryInterval: interval}
	return &relayFixture{relay: newLogRelay("chatty", o, m), m: m, out: out}
}

// dropped is xds_guard_plugin_log_lines_dropped_total{plugin="chatty"}.
func (f *relayFixture) dropped(t *testing.T) int {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(f.m.logDropped)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			return int(m.GetCounter().GetValue())
		}
	}
	return 0
}

// logged returns the plugin's lines that reached the log, and the summaries.
func (f *relayFixture) logged(t *testing.T) (lines int, summaries []map[string]any) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(f.out.String()), "\n") {
		if l == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		switch e["@module"] {
		case "plugin.chatty":
			lines++
		case "plugin":
			summaries = append(summaries, e)
		}
	}
	return lines, summaries
}

func TestLogRelaySummarisesItsDropsOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		f := newRelayFixture(100, 200, 10*time.Second)
		plugin := f.relay.logger().Named("chatty")

		for i := range 1000 {
			plugin.Info("line", "i", i)
		}
		lines, summaries := f.logged(t)
		g.Expect(lines).To(Equal(200), "the burst")
		g.Expect(f.dropped(t)).To(Equal(800), "the rest is counted at once")
		g.Expect(summaries).To(BeEmpty(), "and summarised once the interval is over")

		time.Sleep(10 * time.Second)
		synctest.Wait()
		_, summaries = f.logged(t)
		g.Expect(summaries).To(HaveLen(1))
		g.Expect(summaries[0]).To(HaveKeyWithValue("@message", "plugin chatty: 800 log lines dropped in the last 10s (rate limit 100/s, burst 200)"))
		g.Expect(summaries[0]).To(HaveKeyWithValue("@level", "warn"))
		g.Expect(summaries[0]).To(HaveKeyWithValue("dropped", 800.0))
		g.Expect(summaries[0]).To(HaveKeyWithValue("metric", "xds_guard_plugin_log_lines_dropped_total"))

		// A steady flood, a line a millisecond for 35s: 100 lines a second get through, and the
		// drops are summarised every 10s, not per line.
		for range 35_000 {
			plugin.Info("line")
			time.Sleep(time.Millisecond)
		}
		synctest.Wait()
		lines, summaries = f.logged(t)
		flood := lines - 200
		g.Expect(flood).To(BeNumerically("~", 200+35*100, 2), "the burst refilled over the 10s, then the rate")
		g.Expect(summaries).To(HaveLen(1+3), "one per 10s")
		f.relay.close()
		_, summaries = f.logged(t)
		g.Expect(summaries).To(HaveLen(1+4), "close says what is left")
		g.Expect(summaries[4]["@message"]).To(MatchRegexp(`^plugin chatty: \d+ log lines dropped in the last 4\.\d+s `))

		sum := 0
		for _, s := range summaries {
			sum += int(s["dropped"].(float64))
		}
		g.Expect(sum).To(Equal(f.dropped(t)), "every drop is counted and said")
		g.Expect(sum + lines).To(Equal(1000 + 35_000))

		time.Sleep(time.Minute)
		synctest.Wait()
		_, after := f.logged(t)
		g.Expect(after).To(HaveLen(len(summaries)), "no timer is left after close")
	})
}

func TestLogRelayCloseSaysWhatIsLeftAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		f := newRelayFixture(1, 1, 10*time.Second)
		plugin := f.relay.logger().Named("chatty")
		plugin.Info("passes")
		time.Sleep(500 * time.Millisecond)
		plugin.Warn("dropped")
		time.Sleep(2500 * time.Millisecond)
		f.relay.close()
		_, summaries := f.logged(t)
		g.Expect(summaries).To(HaveLen(1))
		g.Expect(summaries[0]).To(HaveKeyWithValue("@message", "plugin chatty: 1 log lines dropped in the last 2.5s (rate limit 1/s, burst 1)"))

		f.relay.close()
		_, summaries = f.logged(t)
		g.Expect(summaries).To(HaveLen(1), "nothing new to say")
	})
}

func TestRelayLoggerBoundsThePluginsLinesOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		f := newRelayFixture(1, 5, time.Second)
		goplugin := f.relay.logger()
		// go-plugin's own messages pass, however many.
		for range 50 {
			goplugin.Info("plugin process exited")
		}
		// A line the host's log would not show costs no token.
		plugin := goplugin.Named("chatty")
		for range 50 {
			plugin.Debug("quiet")
			plugin.Trace("quieter")
			plugin.Log(hclog.Debug, "quiet")
		}
		g.Expect(f.dropped(t)).To(BeZero())
		// Every way of logging a line spends from one bucket: Named, ResetNamed, With, Log.
		plugin.Info("1")
		plugin.With("k", "v").Warn("2")
		plugin.Log(hclog.Error, "3")
		goplugin.ResetNamed("plugin.chatty").Error("4")
		plugin.Named("stdio").Info("5")
		plugin.Info("6")
		goplugin.With("k", "v").Info("go-plugin's, with args")

		out := f.out.String()
		g.Expect(strings.Count(out, `"plugin process exited"`)).To(Equal(50))
		g.Expect(out).NotTo(ContainSubstring("quiet"))
		for _, m := range []string{`"1"`, `"2"`, `"3"`, `"4"`, `"5"`} {
			g.Expect(out).To(ContainSubstring(`"@message":` + m))
		}
		g.Expect(out).NotTo(ContainSubstring(`"@message":"6"`))
		g.Expect(out).To(ContainSubstring("go-plugin's, with args"))
		g.Expect(f.dropped(t)).To(Equal(1))
		g.Expect(plugin.GetLevel()).To(Equal(hclog.Info), "the level is the host's")
		f.relay.close()
	})
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAPluginsLinesAreSlogRecordsNamedByLoggerKey: what go-plugin logs through the runtime's
// hclog adapter reaches an slog logger as records: go-plugin's own under LoggerKey "plugin", the
// plugin's lines under "plugin.<binary>" without go-plugin's relay timestamp, hclog's levels as
// slog's, and a value without a key under hclog's EXTRA_VALUE_AT_END.
func TestAPluginsLinesAreSlogRecordsNamedByLoggerKey(t *testing.T) {
	g := NewWithT(t)
	out := &lockedBuffer{}
	m := newMetrics(Metrics{}, func() []Status { return nil })
	o := &Options{Logger: slog.New(slog.NewJSONHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})), LogRate: 100, LogBurst: 100, LogSummaryInterval: time.Second}
	r := newLogRelay("chatty", o, m)
	defer r.close()
	goplugin := r.logger()
	goplugin.Debug("plugin address", "network", "unix")
	plugin := goplugin.Named("chatty")
	plugin.Info("policy configured", "policy", "fixed", "timestamp", "2026-01-01T00:00:00.000Z")
	plugin.Trace("below the level")
	plugin.With("k", 1).Error("odd", "lonely")
	g.Expect(goplugin.GetLevel()).To(Equal(hclog.Debug))

	var records []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var e map[string]any
		g.Expect(json.Unmarshal([]byte(l), &e)).To(Succeed())
		delete(e, "time")
		records = append(records, e)
	}
	g.Expect(records).To(Equal([]map[string]any{
		{"level": "DEBUG", "msg": "plugin address", LoggerKey: "plugin", "network": "unix"},
		{"level": "INFO", "msg": "policy configured", LoggerKey: "plugin.chatty", "policy": "fixed"},
		{"level": "ERROR", "msg": "odd", LoggerKey: "plugin.chatty", "k": 1.0, "EXTRA_VALUE_AT_END": "lonely"},
	}))
}

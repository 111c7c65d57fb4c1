package policy_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
)

// hostLog is the host's log as JSON lines: what a plugin relayed (its module is
// "plugin.<binary name>") and the runtime's summaries of what it dropped.
type hostLog struct{ buf *syncBuffer }

func (l hostLog) entries(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, e)
	}
	return out
}

// relayed counts the plugin's own lines in the log.
func (l hostLog) relayed(t *testing.T, module string) int {
	n := 0
	for _, e := range l.entries(t) {
		if e["@module"] == module {
			n++
		}
	}
	return n
}

// summaries are the runtime's "N log lines dropped" lines.
func (l hostLog) summaries(t *testing.T) []map[string]any {
	var out []map[string]any
	for _, e := range l.entries(t) {
		if msg, _ := e["@message"].(string); strings.Contains(msg, "log lines dropped") {
			out = append(out, e)
		}
	}
	return out
}

// TestAPluginThatFloodsItsLogIsRelayedAtTheBoundedRate: a real plugin writes 100,000 log
// lines as fast as it can. The host's log gets at most the burst plus the rate for the time it
// took, and a summary; every other line is counted.
func TestAPluginThatFloodsItsLogIsRelayedAtTheBoundedRate(t *testing.T) {
	g := NewWithT(t)
	const lines = 100_000
	bin := testbin.Build(t, "./policy/testdata/flood")
	t.Setenv("FLOOD_LINES", "100000")
	log := hostLog{&syncBuffer{}}
	cfg := config(policy.Spec{Path: bin})
	cfg.Logger = hostLogger(&hclog.LoggerOptions{Output: log.buf, Level: hclog.Info, JSONFormat: true})
	cfg.Env = []string{"FLOOD_LINES"}
	// The defaults: 100 lines a second, 200 at once, a summary per 10s.
	began := time.Now()
	rt := start(t, cfg)

	dropped := func() int { return int(metricSum(t, rt, "kds_plugin_log_lines_dropped_total")) }
	g.Eventually(func() int { return log.relayed(t, "plugin.flood") + dropped() }, patience, 10*time.Millisecond).
		Should(Equal(lines), "every line is relayed or counted")
	took := time.Since(began)
	relayed := log.relayed(t, "plugin.flood")
	bound := 200 + int(100*took.Seconds()) + 1
	t.Logf("%d lines in %s: %d relayed (bound %d), %d dropped", lines, took.Round(time.Millisecond), relayed, bound, dropped())
	g.Expect(relayed).To(BeNumerically(">=", 200), "the burst gets through")
	g.Expect(relayed).To(BeNumerically("<=", bound))

	rt.Close()
	sums := log.summaries(t)
	g.Expect(sums).NotTo(BeEmpty())
	g.Expect(len(sums)).To(BeNumerically("<=", 1+int(time.Since(began)/(10*time.Second))), "one summary per 10s, and one when the plugin stops")
	said := 0
	for _, s := range sums {
		g.Expect(s["@message"]).To(MatchRegexp(`^plugin flood: \d+ log lines dropped in the last \S+ \(rate limit 100/s, burst 200\)$`))
		said += int(s["dropped"].(float64))
	}
	g.Expect(said).To(Equal(dropped()), "every dropped line is summarised")
	g.Expect(said + relayed).To(Equal(lines))
	g.Expect(log.relayed(t, "plugin.flood")).To(Equal(relayed), "nothing more after the count was complete")
}

// TestARelayedLineHasOneTimestamp: a plugin's hclog JSON line reaches the host's log with the
// host's time only. go-plugin adds the plugin's @timestamp as a field "timestamp" to every line it
// relays, which the host printed beside its own (issue 25): in a text log as "timestamp=..." at
// the end of the line, in a JSON log as "timestamp" beside "@timestamp".
func TestARelayedLineHasOneTimestamp(t *testing.T) {
	bin := testbin.Build(t, "./policy/testdata/flood")
	t.Setenv("FLOOD_LINES", "3")
	for _, jsonLog := range []bool{false, true} {
		t.Run(map[bool]string{false: "text", true: "JSON"}[jsonLog], func(t *testing.T) {
			g := NewWithT(t)
			out := &syncBuffer{}
			cfg := config(policy.Spec{Path: bin})
			cfg.Logger = hostLogger(&hclog.LoggerOptions{Output: out, Level: hclog.Info, JSONFormat: jsonLog})
			cfg.Env = []string{"FLOOD_LINES"}
			start(t, cfg)
			g.Eventually(func() int { return strings.Count(out.String(), "flood") }, patience, 10*time.Millisecond).Should(BeNumerically(">=", 3))
			for _, line := range strings.Split(out.String(), "\n") {
				if !strings.Contains(line, "plugin.flood") {
					continue
				}
				if jsonLog {
					var e map[string]any
					g.Expect(json.Unmarshal([]byte(line), &e)).To(Succeed())
					g.Expect(e).To(HaveKey("@timestamp"))
					g.Expect(e).To(HaveKey("line"), "the plugin's own fields stay")
					g.Expect(e).NotTo(HaveKey("timestamp"), line)
					continue
				}
				g.Expect(line).To(MatchRegexp(`^\d{4}-\d\d-\d\dT\S+ \[INFO\]  plugin\.flood: flood: line=\d+$`), "one timestamp, the host's, first")
			}
		})
	}
}

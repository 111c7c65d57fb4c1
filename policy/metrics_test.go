package policy_test

import (
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/policy"
)

// series returns the label sets (name=value, joined) and values of the metric name in rt's
// collectors.
func series(t *testing.T, rt *policy.Runtime, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rt.Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			out[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// The counters an alert takes a rate or increase of are exported at 0 before their first event:
// a series that appears with its first event is not counted by rate or increase, so the first
// restart, failed call or failed reload would alert nobody (deploy/prometheus). Before, each
// series appeared with its first event.
func TestPluginCountersAreExportedAtZeroBeforeTheirFirstEvent(t *testing.T) {
	g := NewWithT(t)
	rt := start(t, config(policy.Spec{Path: retryForcerBin(t), Document: doc("policy: fixed\ndelay: 30ms\n")}))
	g.Expect(series(t, rt, "kds_plugin_restarts_total")).To(Equal(map[string]float64{"plugin=retry-forcer ": 0}))
	g.Expect(series(t, rt, "kds_plugin_reloads_total")).To(Equal(map[string]float64{"result=error ": 0, "result=ok ": 0}))

	// A call that succeeds exports its method's errors and timeouts at 0 beside its calls.
	_, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	calls := series(t, rt, "kds_plugin_calls_total")
	g.Expect(calls).To(HaveKey("method=Schedule plugin=retry-forcer "))
	for _, name := range []string{"kds_plugin_call_errors_total", "kds_plugin_call_timeouts_total"} {
		got := series(t, rt, name)
		g.Expect(got).To(HaveLen(len(calls)), name)
		for key := range calls {
			g.Expect(got).To(HaveKeyWithValue(key, 0.0), name)
		}
	}
}

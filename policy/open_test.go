package policy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared/launch"
)

func TestParsePlugin(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    policy.Plugin
		wantErr string
	}{
		{in: "./bin/retry-forcer", want: policy.Plugin{Path: "./bin/retry-forcer"}},
		{in: "./bin/retry-forcer@sha256:" + hex64, want: policy.Plugin{Path: "./bin/retry-forcer", SHA256: hex64}},
		{in: "./a@sha256-folder:b/x@sha256:" + hex64, want: policy.Plugin{Path: "./a@sha256-folder:b/x", SHA256: hex64}},
		{in: "builtin", want: policy.Plugin{Path: policy.Builtin}},
		{in: "", wantErr: `plugin "": no path (want PATH, PATH@sha256:HEX or PATH@sha256-folder:HEX)`},
		{in: "./x@sha256:abc", wantErr: `plugin "./x@sha256:abc": the checksum must be 64 hex digits (sha256sum PATH), got "abc"`},
		{in: "./x/plugin.py@sha256-folder:" + hex64, wantErr: `a folder pin is kds-host's; want PATH or PATH@sha256:HEX`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			g := NewWithT(t)
			p, err := policy.ParsePlugin(tc.in)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p).To(Equal(tc.want))
			g.Expect(p.String()).To(Equal(tc.in))
		})
	}
}

// TestOpenRefusesABadOptionOrPluginNamingIt: Open checks before it starts anything.
func TestOpenRefusesABadOptionOrPluginNamingIt(t *testing.T) {
	bin := policy.Plugin{Path: "/nonexistent/retry-forcer"}
	for _, tc := range []struct {
		name    string
		plugins []policy.Plugin
		o       policy.Options
		wantErr string
	}{
		{"a negative timeout", []policy.Plugin{bin}, policy.Options{CallTimeout: -time.Second},
			"policy.Open: Options.CallTimeout -1s: want a positive duration, or 0 for the default"},
		{"a negative backoff", nil, policy.Options{BackoffMax: -1}, "policy.Open: Options.BackoffMax -1ns: want a positive duration"},
		{"a negative log rate", nil, policy.Options{LogRate: -1}, "policy.Open: Options.LogRate -1: want a positive rate"},
		{"a negative count", nil, policy.Options{HungAfter: -2}, "policy.Open: Options.HungAfter -2: want a positive count"},
		{"an env name with a value", nil, policy.Options{Env: []string{"AWS_REGION=eu-1"}}, "policy.Open: Options.Env: "},
		{"a namespace that is no metric name", nil, policy.Options{Metrics: policy.Metrics{Namespace: "xds-guard"}},
			`policy.Open: Metrics.Namespace "xds-guard": want a Prometheus metric name prefix`},
		{"a const label that is no label name", nil, policy.Options{Metrics: policy.Metrics{ConstLabels: prometheus.Labels{"a-b": "x"}}},
			`policy.Open: Metrics.ConstLabels: "a-b" is not a Prometheus label name`},
		{"a const label of the runtime's own", nil, policy.Options{Metrics: policy.Metrics{ConstLabels: prometheus.Labels{"plugin": "x"}}},
			`policy.Open: Metrics.ConstLabels: "plugin" is a label of the runtime's own metrics (plugin, method, result)`},
		{"a plugin without a path", []policy.Plugin{bin, {SHA256: hex64}}, policy.Options{},
			"policy.Open: plugins[1].Path is empty: want a plugin binary, or builtin"},
		{"a checksum that is not 64 hex digits", []policy.Plugin{{Path: bin.Path, SHA256: "abc"}}, policy.Options{},
			`policy.Open: plugins[0].SHA256 "abc": want 64 hex digits (sha256sum /nonexistent/retry-forcer)`},
		{"a checksum of the built-in policies", []policy.Plugin{{Path: policy.Builtin, SHA256: hex64}}, policy.Options{},
			"policy.Open: plugins[0].SHA256: the built-in policies take no checksum"},
		{"the built-in policies twice", []policy.Plugin{{Path: policy.Builtin}, {Path: policy.Builtin}}, policy.Options{},
			"policy.Open: builtin is listed twice"},
		{"a bad document for the built-in policy", []policy.Plugin{{Path: policy.Builtin, Config: []byte("policy: sometimes\n")}}, policy.Options{},
			"policy.Open: configure the built-in retry policy with plugins[0].Config: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			rt, err := policy.Open(context.Background(), tc.plugins, tc.o)
			g.Expect(rt).To(BeNil())
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
		})
	}
}

// TestOpenRunsAPinnedPluginWithItsConfig: an adopter's plugin, by path, checksum and config.
func TestOpenRunsAPinnedPluginWithItsConfig(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	p, err := policy.ParsePlugin(bin + "@sha256:" + sha256File(t, bin))
	g.Expect(err).NotTo(HaveOccurred())
	p.Config = []byte("policy: fixed\ndelay: 1234ms\n")
	rt, err := policy.Open(context.Background(), []policy.Plugin{p}, policy.Options{Logger: testLogger()})
	g.Expect(err).NotTo(HaveOccurred())
	defer rt.Close()

	d, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(1234 * time.Millisecond))
	st := statusOf(rt, "retry-forcer")
	g.Expect(st.Checksum).To(Equal("sha256:" + p.SHA256))
	g.Expect(st.Policy).To(Equal("fixed delay=1.234s"))
	g.Expect(series(t, rt, "xds_guard_plugin_up")).To(HaveKeyWithValue("plugin=retry-forcer ", 1.0), "the default namespace")

	// The wrong checksum: refused, nothing left running.
	p.SHA256 = hex64
	_, err = policy.Open(context.Background(), []policy.Plugin{p}, policy.Options{})
	var ce *launch.ChecksumError
	g.Expect(errors.As(err, &ce)).To(BeTrue(), "%v", err)
}

// TestTwoRuntimesShareARegistryByTheirConstLabels: the same namespace, told apart by a label.
func TestTwoRuntimesShareARegistryByTheirConstLabels(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewPedanticRegistry()
	for _, server := range []string{"edge", "mesh"} {
		rt, err := policy.Open(context.Background(), nil, policy.Options{Metrics: policy.Metrics{ConstLabels: prometheus.Labels{"server": server}}})
		g.Expect(err).NotTo(HaveOccurred())
		defer rt.Close()
		for _, c := range rt.Collectors() {
			g.Expect(reg.Register(c)).To(Succeed())
		}
	}
	families, err := reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	up := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "xds_guard_plugin_up" {
			continue
		}
		for _, m := range f.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			up[key] = m.GetGauge().GetValue()
		}
	}
	g.Expect(up).To(Equal(map[string]float64{"plugin=builtin server=edge ": 1, "plugin=builtin server=mesh ": 1}))
}

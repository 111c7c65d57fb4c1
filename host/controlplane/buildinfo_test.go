package controlplane

import (
	"runtime"
	"runtime/debug"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// kds_build_info's labels name the version given, the revision Go stamped (marked dirty for a
// modified tree, unknown when none was stamped) and the Go version.
func TestBuildInfoNamesTheVersionTheRevisionAndGo(t *testing.T) {
	stamped := func(settings ...debug.BuildSetting) *debug.BuildInfo { return &debug.BuildInfo{Settings: settings} }
	for _, tc := range []struct {
		name             string
		version          string
		bi               *debug.BuildInfo
		wantVer, wantRev string
	}{
		{"a clean stamped build", "v1.2.3", stamped(debug.BuildSetting{Key: "vcs.revision", Value: "abc123"}, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "v1.2.3", "abc123"},
		{"a modified tree", "v1.2.3", stamped(debug.BuildSetting{Key: "vcs.revision", Value: "abc123"}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "v1.2.3", "abc123-dirty"},
		{"a build with no revision stamped", "", stamped(debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "dev", "unknown"},
		{"no build info", "", nil, "dev", "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(buildInfoLabels(tc.version, tc.bi)).To(Equal(prometheus.Labels{"version": tc.wantVer, "revision": tc.wantRev, "go_version": runtime.Version()}))
		})
	}
}

// The series is 1 and carries those labels.
func TestBuildInfoIsOne(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewPedanticRegistry()
	registerBuildInfo(reg, "v9")
	g.Expect(testutil.GatherAndCount(reg, "kds_build_info")).To(Equal(1))
	mfs, err := reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	m := mfs[0].GetMetric()[0]
	g.Expect(m.GetGauge().GetValue()).To(Equal(1.0))
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	g.Expect(labels).To(HaveKeyWithValue("version", "v9"))
	g.Expect(labels).To(HaveKeyWithValue("go_version", runtime.Version()))
	g.Expect(labels).To(HaveKey("revision"))
}

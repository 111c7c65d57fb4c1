package controlplane

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// registerBuildInfo registers kds_build_info, 1 with the labels buildInfoLabels gives.
func registerBuildInfo(reg prometheus.Registerer, version string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kds_build_info",
		Help:        "1, with the version kds-host was built as (-X main.version), the VCS revision Go stamped into the binary (\"unknown\" when the build did not stamp one; \"-dirty\" appended for a modified tree) and the Go version.",
		ConstLabels: buildInfoLabels(version, bi)})
	g.Set(1)
	reg.MustRegister(g)
}

// buildInfoLabels are kds_build_info's labels:
//   - version: version, "dev" when empty;
//   - revision: bi's vcs.revision, with "-dirty" when vcs.modified is true; "unknown" without bi
//     or a revision;
//   - go_version: the running Go's version.
func buildInfoLabels(version string, bi *debug.BuildInfo) prometheus.Labels {
	if version == "" {
		version = "dev"
	}
	revision, modified := "", false
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	switch {
	case revision == "":
		revision = "unknown"
	case modified:
		revision += "-dirty"
	}
	return prometheus.Labels{"version": version, "revision": revision, "go_version": runtime.Version()}
}

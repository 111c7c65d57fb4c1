package guard_test

import (
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/guard"
	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared"
)

// An option no default makes sense of is refused by the constructor, with its name.
func TestOptionsThatMakeNoSenseAreRefusedByName(t *testing.T) {
	snapshots := func() cache.Cache { return cache.NewSnapshotCache(true, cache.IDHash{}, nil) }
	for _, c := range []struct {
		name string
		opts guard.Options
		want string
	}{
		{"a negative policy timeout", guard.Options{PolicyTimeout: -1}, "guard: Options.PolicyTimeout -1ns: want a positive duration, or 0 for the default"},
		{"a negative owner check timeout", guard.Options{OwnerCheckTimeout: -time.Second}, "guard: Options.OwnerCheckTimeout -1s"},
		{"a negative type bound", guard.Options{MaxTypesPerStream: -1}, "guard: Options.MaxTypesPerStream -1"},
		{"a negative name bound", guard.Options{MaxNamesPerStream: -5}, "guard: Options.MaxNamesPerStream -5"},
		{"plugins and a policy", guard.Options{Plugins: []policy.Plugin{{Path: "/x"}}, RetryPolicy: func() shared.RetryForcer { return retrypolicy.New() }}, "guard: Options.Plugins and Options.RetryPolicy"},
		{"node independent over a SnapshotCache", guard.Options{NodeIndependent: true}, "guard: Options.NodeIndependent over a SnapshotCache"},
		{"node independent and a node hash", guard.Options{NodeIndependent: true, NodeHash: cache.IDHash{}}, "guard: Options.NodeIndependent and Options.NodeHash"},
		{"a plugin that is not there", guard.Options{Plugins: []policy.Plugin{{Path: "/no/such/plugin"}}}, "guard: Options.Plugins: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := guard.New(snapshots(), c.opts)
			g.Expect(err).To(MatchError(ContainSubstring(c.want)))
			if !c.opts.NodeIndependent {
				_, err = guard.NewCache([]string{resource.ClusterType}, c.opts)
				g.Expect(err).To(MatchError(ContainSubstring(c.want)))
			}
		})
	}
	g := NewWithT(t)
	gd, err := guard.New(&cache.MuxCache{}, guard.Options{NodeIndependent: true})
	g.Expect(err).NotTo(HaveOccurred(), "a MuxCache may answer every node alike")
	gd.Close()
}

// Two guards, each with its own const labels, export into one registry.
func TestTwoGuardsShareOneRegistry(t *testing.T) {
	g := NewWithT(t)
	reg := prometheus.NewPedanticRegistry()
	for _, server := range []string{"edge", "mesh"} {
		gd, err := guard.New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), guard.Options{Metrics: policy.Metrics{ConstLabels: prometheus.Labels{"server": server}}})
		g.Expect(err).NotTo(HaveOccurred())
		defer gd.Close()
		g.Expect(reg.Register(gd.Collector())).To(Succeed())
	}
	families, err := reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	byName := map[string]int{}
	for _, f := range families {
		byName[f.GetName()] = len(f.GetMetric())
	}
	g.Expect(byName).To(HaveKeyWithValue("xds_guard_clients", 2))

	c, err := guard.NewCache([]string{resource.ClusterType}, guard.Options{Metrics: policy.Metrics{Namespace: "edge_xds"}})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	g.Expect(reg.Register(c.Collector())).To(Succeed(), "another namespace")
	c.Close() // and the deferred second Close does nothing
}

// Options.Plugins loads the reference retry-forcer as a real go-plugin process, and the guard
// exports the plugin's metrics in its namespace.
func TestAPluginIsLoadedByPath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the retry-forcer binary")
	}
	g := NewWithT(t)
	bin := testbin.Build(t, "./plugins/retry-forcer")
	gd, err := guard.New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), guard.Options{Plugins: []policy.Plugin{{Path: bin, Config: []byte("policy: exponential\n")}}})
	g.Expect(err).NotTo(HaveOccurred())
	reg := prometheus.NewPedanticRegistry()
	g.Expect(reg.Register(gd.Collector())).To(Succeed())
	families, err := reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	g.Expect(names).To(ContainElement(HavePrefix("xds_guard_plugin_")))
	gd.Close()
}

package guard_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/guard"
)

// The three ways a delta client may be served here: go-control-plane's SnapshotCache as it is,
// the same wrapped by the guard, and kds-host's cache (guard.NewCache).
const (
	stock    = "stock"
	wrapped  = "guard"
	kdsCache = "kds-cache"
)

// deltaClient is a raw delta ADS stream to a go-control-plane server served the way mode says,
// with the function that sets the clusters it serves, and the insight of the guard's modes.
func deltaClient(t *testing.T, mode string) (discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, func(...types.Resource), insight) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := newSotw(t, false)
	var c cache.Cache = h.snap
	var cb server.Callbacks
	set := h.set
	var ins insight
	var closer func()
	switch mode {
	case wrapped:
		g, err := guard.New(h.snap, guard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, cb, ins, closer = g, g.Callbacks(nil), g, g.Close
	case kdsCache:
		kc, err := guard.NewCache([]string{resource.ClusterType}, guard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c, cb, ins, closer = kc, kc.Callbacks(nil), kc, kc.Close
		set = func(clusters ...types.Resource) {
			if err := kc.SetResources(map[string][]types.Resource{resource.ClusterType: clusters}); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, c, cb)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if closer != nil {
			closer()
		}
	})
	return st, set, ins
}

// insight is what the guard's two modes both give.
type insight interface {
	Clients() []guard.ClientInsight
	Collector() prometheus.Collector
}

// recvDelta is the next delta response, or nil after d.
func recvDelta(t *testing.T, in <-chan *discovery.DeltaDiscoveryResponse, d time.Duration) *discovery.DeltaDiscoveryResponse {
	t.Helper()
	select {
	case r := <-in:
		return r
	case <-time.After(d):
		return nil
	}
}

func deltaNames(r *discovery.DeltaDiscoveryResponse) []string {
	var out []string
	for _, res := range r.GetResources() {
		out = append(out, res.GetName())
	}
	slices.Sort(out)
	return out
}

// A delta client that refuses a cluster: stock go-control-plane counts the refused version as
// the client's and never sends it again until its content changes; guarded, the retry policy
// sends it again its attempts (the built-in policy: 3 sends in all), then parks it; in both, a
// change of another cluster goes alone and new content of the refused one is sent. kds-host's
// cache does as the guard does.
func TestADeltaClientsRefusedClusterIsRetriedThePolicysAttempts(t *testing.T) {
	for _, mode := range []string{stock, wrapped, kdsCache} {
		t.Run(mode, func(t *testing.T) {
			g := NewWithT(t)
			st, set, ins := deltaClient(t, mode)
			guarded := mode != stock
			in := make(chan *discovery.DeltaDiscoveryResponse, 100)
			go func() {
				for {
					r, err := st.Recv()
					if err != nil {
						return
					}
					in <- r
				}
			}()
			set(edsCluster("a", cluster.Cluster_ROUND_ROBIN), edsCluster("b", cluster.Cluster_MAGLEV))
			g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{Node: nodeOf("client"), TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})).To(Succeed())
			nack := func(r *discovery.DeltaDiscoveryResponse) {
				g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce(),
					ErrorDetail: &rpcstatus.Status{Code: 3, Message: `error parsing "ClusterResource" response: resource "b": unsupported lb policy MAGLEV`}})).To(Succeed())
			}
			ack := func(r *discovery.DeltaDiscoveryResponse) {
				g.Expect(st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: r.GetNonce()})).To(Succeed())
			}
			r := recvDelta(t, in, 5*time.Second)
			g.Expect(deltaNames(r)).To(Equal([]string{"a", "b"}))
			nack(r)
			sends := 1
			for r := recvDelta(t, in, 2*time.Second); r != nil; r = recvDelta(t, in, 2*time.Second) {
				g.Expect(deltaNames(r)).To(Equal([]string{"b"}), "only the refused cluster, again")
				sends++
				nack(r)
			}
			if guarded {
				g.Expect(sends).To(Equal(3), "the built-in policy's invalidAttempts")
				var w []guard.Withheld
				for _, ti := range ins.Clients()[0].Types {
					w = append(w, ti.Withheld...)
				}
				g.Expect(w).To(ConsistOf(HaveField("Name", "b")))
				g.Expect(testutil.ToFloat64(metric(ins.Collector(), "xds_guard_nacks_total"))).To(BeEquivalentTo(3))
				g.Expect(testutil.ToFloat64(metric(ins.Collector(), "xds_guard_clients"))).To(BeEquivalentTo(1))
			} else {
				g.Expect(sends).To(Equal(1), "stock never sends a refused version again")
			}

			set(edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_MAGLEV))
			r = recvDelta(t, in, 5*time.Second)
			g.Expect(deltaNames(r)).To(Equal([]string{"a"}))
			ack(r)
			set(edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_ROUND_ROBIN))
			r = recvDelta(t, in, 5*time.Second)
			g.Expect(deltaNames(r)).To(Equal([]string{"b"}))
			ack(r)
			g.Expect(recvDelta(t, in, 300*time.Millisecond)).To(BeNil())
		})
	}
}

// metric is the one series of name that c collects.
func metric(c prometheus.Collector, name string) prometheus.Collector {
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		if strings.Contains(m.Desc().String(), `"`+name+`"`) {
			return constCollector{m}
		}
	}
	return constCollector{}
}

type constCollector struct{ m prometheus.Metric }

func (c constCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.m != nil {
		ch <- c.m.Desc()
	}
}

func (c constCollector) Collect(ch chan<- prometheus.Metric) {
	if c.m != nil {
		ch <- c.m
	}
}

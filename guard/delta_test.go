package guard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/guard"
)

// deltaClient is a raw delta ADS stream to a go-control-plane server over h's SnapshotCache,
// guarded or not.
func deltaClient(t *testing.T, h *sotw, guarded bool) (discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, *guard.Guard) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var c cache.Cache = h.snap
	var cb server.Callbacks
	var g *guard.Guard
	if guarded {
		var err error
		if g, err = guard.New(h.snap, guard.Options{}); err != nil {
			t.Fatal(err)
		}
		c, cb = g, g.Callbacks(nil)
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, c, cb)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if g != nil {
			g.Close()
		}
	})
	return st, g
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
// change of another cluster goes alone and new content of the refused one is sent.
func TestADeltaClientsRefusedClusterIsRetriedThePolicysAttempts(t *testing.T) {
	for _, guarded := range []bool{false, true} {
		t.Run(map[bool]string{false: "stock", true: "guard"}[guarded], func(t *testing.T) {
			g := NewWithT(t)
			h := newSotw(t, false)
			st, gd := deltaClient(t, h, guarded)
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
			h.set(edsCluster("a", cluster.Cluster_ROUND_ROBIN), edsCluster("b", cluster.Cluster_MAGLEV))
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
				for _, ti := range gd.Clients()[0].Types {
					w = append(w, ti.Withheld...)
				}
				g.Expect(w).To(ConsistOf(HaveField("Name", "b")))
			} else {
				g.Expect(sends).To(Equal(1), "stock never sends a refused version again")
			}

			h.set(edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_MAGLEV))
			r = recvDelta(t, in, 5*time.Second)
			g.Expect(deltaNames(r)).To(Equal([]string{"a"}))
			ack(r)
			h.set(edsCluster("a", cluster.Cluster_LEAST_REQUEST), edsCluster("b", cluster.Cluster_ROUND_ROBIN))
			r = recvDelta(t, in, 5*time.Second)
			g.Expect(deltaNames(r)).To(Equal([]string{"b"}))
			ack(r)
			g.Expect(recvDelta(t, in, 300*time.Millisecond)).To(BeNil())
		})
	}
}

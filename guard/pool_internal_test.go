package guard

import (
	"context"
	"testing"
	"testing/synctest"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
)

// setClusters sets node's snapshot of h's per-node cache: clusters, at version.
func setClusters(g Gomega, h *guardedServer, node, version string, clusters ...types.Resource) {
	s, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: clusters})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h.snap.SetSnapshot(context.Background(), node, s)).To(Succeed())
}

// syncedClients gives nodes a, b and c clusters, and opens a SotW stream of each, which ACKs its
// first response.
func syncedClients(g Gomega, h *guardedServer, clusters ...types.Resource) []*sotwStream {
	var streams []*sotwStream
	for _, n := range []string{"a", "b", "c"} {
		setClusters(g, h, n, "1", clusters...)
		st := h.sotw()
		st.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: n}, TypeUrl: resource.ClusterType})
		streams = append(streams, st)
	}
	for _, st := range streams {
		rs := st.received()
		g.Expect(rs).To(HaveLen(1))
		st.send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: rs[0].GetVersionInfo(), ResponseNonce: rs[0].GetNonce()})
	}
	return streams
}

// The nodes a per-node cache answers alike share one engine snapshot, whose encodings and name
// orders the engine makes once for all of them; a node given other content gets its own; the
// pool lets go of a snapshot once no node's stream uses it.
func TestNodesAPerNodeCacheAnswersAlikeShareOneSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		h := newGuardedServer(t, Options{})
		set := func(node, version string, clusters ...types.Resource) { setClusters(g, h, node, version, clusters...) }
		streams := syncedClients(g, h, eds("y"), eds("z"))
		snapOf := func(node string) *engine.Snapshot {
			h.g.mu.Lock()
			f := h.g.feeds[node]
			h.g.mu.Unlock()
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.snap
		}
		g.Expect(snapOf("a")).To(BeIdenticalTo(snapOf("b")))
		g.Expect(snapOf("a")).To(BeIdenticalTo(snapOf("c")))
		g.Expect(h.g.pool.by).To(HaveLen(1))

		set("c", "2", eds("y"))
		g.Expect(streams[2].received()).To(HaveLen(1))
		g.Expect(snapOf("c")).NotTo(BeIdenticalTo(snapOf("a")))
		g.Expect(snapOf("c").Type(resource.ClusterType)).To(HaveLen(1))
		g.Expect(snapOf("a")).To(BeIdenticalTo(snapOf("b")))
		g.Expect(h.g.pool.by).To(HaveLen(2))

		for _, st := range streams {
			st.stop()
		}
		synctest.Wait()
		g.Expect(h.g.pool.by).To(BeEmpty())
	})
}

// The nodes of a per-node cache that move from one shared snapshot with the same answer take the
// step the first of them made, not a snapshot each (made, then found equal in the pool); a node
// answered otherwise makes its own; the steps go with the snapshots they start from.
func TestNodesGivenTheSameChangeTakeTheFirstNodesStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		h := newGuardedServer(t, Options{})
		set := func(node, version string, clusters ...types.Resource) { setClusters(g, h, node, version, clusters...) }
		y, z := eds("y"), eds("z")
		streams := syncedClients(g, h, y, z)
		feedOf := func(node string) *feed {
			h.g.mu.Lock()
			defer h.g.mu.Unlock()
			return h.g.feeds[node]
		}
		pooledOf := func(node string) *pooled {
			f := feedOf(node)
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.pooled
		}
		stepsFrom := func(p *pooled) int {
			h.g.pool.mu.Lock()
			defer h.g.pool.mu.Unlock()
			return len(h.g.pool.steps[p])
		}
		from := pooledOf("a")
		g.Expect(pooledOf("b")).To(BeIdenticalTo(from))

		y2 := eds("y")
		y2.AltStatName = "v2" // another version of y
		set("a", "2", y2, z)
		synctest.Wait()
		g.Expect(stepsFrom(from)).To(Equal(1), "a made the step from the snapshot b and c share")
		set("b", "2", y2, z)
		synctest.Wait()
		g.Expect(pooledOf("b")).To(BeIdenticalTo(pooledOf("a")))
		g.Expect(stepsFrom(from)).To(Equal(1), "b took a's step: it made none")

		set("c", "2", y) // another change: its own step
		synctest.Wait()
		g.Expect(pooledOf("c")).NotTo(BeIdenticalTo(pooledOf("a")))
		g.Expect(feedOf("c").snap.Type(resource.ClusterType)).To(HaveLen(1))
		for i, st := range streams {
			rs := st.received()
			g.Expect(rs).To(HaveLen(1), "stream %d", i)
			g.Expect(rs[0].GetResources()).To(HaveLen(map[int]int{0: 2, 1: 2, 2: 1}[i]), "stream %d", i)
		}
		g.Expect(stepsFrom(from)).To(BeZero(), "no node uses the snapshot the steps were from")

		for _, st := range streams {
			st.stop()
		}
		synctest.Wait()
		g.Expect(h.g.pool.by).To(BeEmpty())
		g.Expect(h.g.pool.steps).To(BeEmpty())
	})
}

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

// The nodes a per-node cache answers alike share one engine snapshot, whose encodings and name
// orders the engine makes once for all of them; a node given other content gets its own; the
// pool lets go of a snapshot once no node's stream uses it.
func TestNodesAPerNodeCacheAnswersAlikeShareOneSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		h := newGuardedServer(t, Options{})
		set := func(node, version string, clusters ...types.Resource) {
			s, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: clusters})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(h.snap.SetSnapshot(context.Background(), node, s)).To(Succeed())
		}
		nodes := []string{"a", "b", "c"}
		for _, n := range nodes {
			set(n, "1", eds("y"), eds("z"))
		}
		var streams []*sotwStream
		for _, n := range nodes {
			st := h.sotw()
			st.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: n}, TypeUrl: resource.ClusterType})
			streams = append(streams, st)
		}
		for i, st := range streams { // each ACKs its response
			rs := st.received()
			g.Expect(rs).To(HaveLen(1))
			st.send(&discovery.DiscoveryRequest{Node: &core.Node{Id: nodes[i]}, TypeUrl: resource.ClusterType,
				VersionInfo: rs[0].GetVersionInfo(), ResponseNonce: rs[0].GetNonce()})
		}
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

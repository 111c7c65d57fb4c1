package engine

import (
	"testing"
	"testing/synctest"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

// nodeSnapshotZones is a cache of MeshTimeouts with UseNodeSnapshots and a zone of the engine's
// own loop for each of nodes, stopped (then the cache closed) when the test ends.
func nodeSnapshotZones(t *testing.T, nodes ...string) (*Cache, []*loopZone) {
	c := NewCache([]string{"MeshTimeout"})
	c.UseNodeSnapshots()
	t.Cleanup(c.Close)
	tr := NewTracker(c)
	var zones []*loopZone
	for i, n := range nodes {
		zones = append(zones, startLoopZone(c, tr, int64(i+1), n))
	}
	t.Cleanup(func() {
		for _, z := range zones {
			z.cancel()
			<-z.done
		}
	})
	return c, zones
}

// With UseNodeSnapshots, a node sees its own snapshot only: nothing (its watch left open) until
// one is set, then what it holds; a write of one node's snapshot answers that node alone, with
// the names that changed; a global SetSnapshot answers none of them.
func TestANodeSeesItsOwnSnapshotOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c, zones := nodeSnapshotZones(t, "a", "b")
		a, b := zones[0], zones[1]
		synctest.Wait()
		g.Expect(a.str.sent).To(BeEmpty(), "no snapshot of its node yet")

		var sa, sb testSnapshots
		snapA, err := sa.Build([]resource.Resource{policyAt("MeshTimeout", "p", 1, 10), policyAt("MeshTimeout", "q", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetNodeSnapshot("a", snapA)
		synctest.Wait()
		g.Expect(b.str.sent).To(BeEmpty(), "another node's snapshot")
		var r *discovery.DeltaDiscoveryResponse
		g.Expect(a.str.sent).To(Receive(&r))
		g.Expect(r.Resources).To(HaveLen(2))
		a.ack(r)

		var global testSnapshots
		all, err := global.Build([]resource.Resource{policyAt("MeshTimeout", "z", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(all)
		synctest.Wait()
		g.Expect(a.str.sent).To(BeEmpty())
		g.Expect(b.str.sent).To(BeEmpty())

		next, err := sa.Update([]resource.Resource{policyAt("MeshTimeout", "q", 2, 10)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetNodeSnapshot("a", next)
		synctest.Wait()
		g.Expect(a.str.sent).To(Receive(&r))
		g.Expect(r.Resources).To(HaveLen(1), "what changed")
		g.Expect(r.Resources[0].Version).To(Equal(next.Type("MeshTimeout")[r.Resources[0].Name].Version))

		snapB, err := sb.Build([]resource.Resource{policyAt("MeshTimeout", "r", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetNodeSnapshot("b", snapB)
		synctest.Wait()
		g.Expect(b.str.sent).To(Receive(&r))
		g.Expect(r.Resources).To(HaveLen(1))
		g.Expect(a.str.sent).To(BeEmpty())
	})
}

// Without UseNodeSnapshots, a node with a snapshot of its own reads it, the others the global one.
func TestANodeSnapshotOverridesTheGlobalOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		var sa, global testSnapshots
		snapA, err := sa.Build([]resource.Resource{policyAt("MeshTimeout", "p", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetNodeSnapshot("a", snapA) // before its stream: read when it is admitted
		all, err := global.Build([]resource.Resource{policyAt("MeshTimeout", "z", 1, 10), policyAt("MeshTimeout", "y", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(all)
		a, b := startLoopZone(c, tr, 1, "a"), startLoopZone(c, tr, 2, "b")
		defer func() {
			for _, z := range []*loopZone{a, b} {
				z.cancel()
				<-z.done
			}
		}()
		synctest.Wait()
		var r *discovery.DeltaDiscoveryResponse
		g.Expect(a.str.sent).To(Receive(&r))
		g.Expect(r.Resources).To(HaveLen(1))
		a.ack(r)
		g.Expect(b.str.sent).To(Receive(&r))
		g.Expect(r.Resources).To(HaveLen(2))
		b.ack(r)

		// Back to the global one: the node is told what differs.
		c.SetNodeSnapshot("a", nil)
		synctest.Wait()
		g.Expect(a.str.sent).To(Receive(&r))
		g.Expect(r.Resources).To(HaveLen(2))
		g.Expect(r.RemovedResources).To(HaveLen(1))
	})
}

// With UseNodeSnapshots, a SotW client of a node without a snapshot of its own is sent nothing,
// not even an empty state (a client takes an empty CDS as no clusters), whatever the global
// snapshot and another node's say; its node's snapshot, once set, is its whole state, an empty
// one included.
func TestWithNodeSnapshotsASotWClientIsSentNothingUntilItsNodeHasOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		const kind = resourcev3.ClusterType
		c := NewCache([]string{kind})
		c.UseNodeSnapshots()
		defer c.Close()
		tr := NewTracker(c)
		c.SetSnapshot(SnapshotOf([]*Entry{clusterEntry(t, "global", "1")}).Declare(kind))
		a, b := openClient(t, c, tr, 1, "a", true), openClient(t, c, tr, 2, "b", true)
		for _, cl := range []*testClient{a, b} {
			g.Expect(cl.ask(kind, nil, "")).To(Succeed())
			g.Expect(cl.take(kind)).To(BeNil(), "no snapshot of its node")
		}

		c.SetNodeSnapshot("a", SnapshotOf(nil).Declare(kind))
		expectSent(t, a.ackAll(kind, nil), []string{}, "its node's empty snapshot")
		g.Expect(b.take(kind)).To(BeNil(), "another node's snapshot")

		bs := SnapshotOf([]*Entry{clusterEntry(t, "b1", "1"), clusterEntry(t, "b2", "1")})
		c.SetNodeSnapshot("b", bs)
		expectSent(t, b.ackAll(kind, nil), []string{"b1", "b2"}, "its node's snapshot")
		g.Expect(a.take(kind)).To(BeNil())
		snap, only := c.NodeSnapshot("b")
		g.Expect(snap).To(BeIdenticalTo(bs))
		g.Expect(only).To(BeTrue())
	})
}

// With UseNodeSnapshots, a node's snapshot set before its stream is admitted (the guard sets it
// as a stream joins) is read when the stream is admitted, and by the node's every stream after,
// until it is cleared: then a new stream of the node is sent nothing.
func TestANodesSnapshotIsReadByEachOfItsStreamsUntilCleared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		const kind = resourcev3.ClusterType
		c := NewCache([]string{kind})
		c.UseNodeSnapshots()
		defer c.Close()
		tr := NewTracker(c)
		c.SetNodeSnapshot("a", SnapshotOf([]*Entry{clusterEntry(t, "p", "1")}))
		for id := range int64(2) {
			cl := openClient(t, c, tr, id+1, "a", false)
			g.Expect(cl.ask(kind, nil, "")).To(Succeed())
			expectSent(t, cl.ackAll(kind, nil), []string{"p"}, "stream %d", id+1)
			cl.close()
		}
		c.SetNodeSnapshot("a", nil)
		snap, only := c.NodeSnapshot("a")
		g.Expect(snap).To(BeNil())
		g.Expect(only).To(BeTrue())
		cl := openClient(t, c, tr, 3, "a", false)
		g.Expect(cl.ask(kind, nil, "")).To(Succeed())
		g.Expect(cl.take(kind)).To(BeNil(), "cleared: nothing")
	})
}

// With UseNodeSnapshots, clearing a node's snapshot (SetNodeSnapshot nil) sends its stream
// nothing, no removal either: it keeps what it holds, and a global snapshot still does not reach
// it. A snapshot set again is compared with what it holds.
func TestClearingANodesSnapshotLeavesItWhatItHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		const kind = resourcev3.ClusterType
		c := NewCache([]string{kind})
		c.UseNodeSnapshots()
		defer c.Close()
		tr := NewTracker(c)
		cl := openClient(t, c, tr, 1, "a", false)
		g.Expect(cl.ask(kind, nil, "")).To(Succeed())
		c.SetNodeSnapshot("a", SnapshotOf([]*Entry{clusterEntry(t, "p", "1"), clusterEntry(t, "q", "1")}))
		expectSent(t, cl.ackAll(kind, nil), []string{"p", "q"}, "its node's snapshot")

		c.SetNodeSnapshot("a", nil)
		g.Expect(cl.take(kind)).To(BeNil(), "cleared: nothing removed")
		c.SetSnapshot(SnapshotOf([]*Entry{clusterEntry(t, "global", "1")}))
		g.Expect(cl.take(kind)).To(BeNil(), "the global snapshot")
		v, ok := cl.session().AckedVersion(kind, "p")
		g.Expect([]any{v, ok}).To(Equal([]any{"1", true}), "it still holds p")

		c.SetNodeSnapshot("a", SnapshotOf([]*Entry{clusterEntry(t, "q", "2")}))
		r := cl.take(kind)
		g.Expect(r).NotTo(BeNil())
		g.Expect(r.names).To(Equal([]string{"q"}))
		g.Expect(r.removed).To(Equal([]string{"p"}))
	})
}

// SetNodesSnapshot sets one snapshot for several nodes at once: each is answered as
// SetNodeSnapshot would (what it lacks, then what changed), and a node not named is not.
func TestNodesGivenOneSnapshotAtOnceAreEachAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c, zones := nodeSnapshotZones(t, "a", "b", "c")
		synctest.Wait()
		var ss testSnapshots
		first, err := ss.Build([]resource.Resource{policyAt("MeshTimeout", "p", 1, 10), policyAt("MeshTimeout", "q", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetNodesSnapshot([]string{"a", "b"}, first)
		synctest.Wait()
		for _, z := range zones[:2] {
			var r *discovery.DeltaDiscoveryResponse
			g.Expect(z.str.sent).To(Receive(&r))
			g.Expect(r.Resources).To(HaveLen(2))
			z.ack(r)
		}
		g.Expect(zones[2].str.sent).To(BeEmpty(), "not named")

		next, err := ss.Update([]resource.Resource{policyAt("MeshTimeout", "q", 2, 10)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetNodesSnapshot([]string{"a", "b", "gone"}, next)
		synctest.Wait()
		for _, z := range zones[:2] {
			var r *discovery.DeltaDiscoveryResponse
			g.Expect(z.str.sent).To(Receive(&r))
			g.Expect(r.Resources).To(HaveLen(1), "what changed")
			g.Expect(r.Resources[0].Version).To(Equal(next.Type("MeshTimeout")[r.Resources[0].Name].Version))
			g.Expect(r.Resources[0].Version).NotTo(Equal(first.Type("MeshTimeout")[r.Resources[0].Name].Version))
		}
		g.Expect(zones[2].str.sent).To(BeEmpty())
		s, only := c.NodeSnapshot("gone")
		g.Expect(s).To(BeIdenticalTo(next), "a node without a stream gets it when it connects")
		g.Expect(only).To(BeTrue())
	})
}

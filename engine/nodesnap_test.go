package engine

import (
	"testing"
	"testing/synctest"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

// With UseNodeSnapshots, a node sees its own snapshot only: nothing (its watch left open) until
// one is set, then what it holds; a write of one node's snapshot answers that node alone, with
// the names that changed; a global SetSnapshot answers none of them.
func TestANodeSeesItsOwnSnapshotOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		c.UseNodeSnapshots()
		defer c.Close()
		tr := NewTracker(c)
		a, b := startLoopZone(c, tr, 1, "a"), startLoopZone(c, tr, 2, "b")
		defer func() {
			for _, z := range []*loopZone{a, b} {
				z.cancel()
				<-z.done
			}
		}()
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

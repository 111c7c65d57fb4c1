package engine

import (
	"testing"
	"testing/synctest"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/anypb"
)

// makeBeforeBreak is keepReferenced, and it holds a version back until the client holds what it
// references.
type makeBeforeBreak struct{ keepReferenced }

func (makeBeforeBreak) Withhold(c ClientView, e *Entry) (string, *Entry) {
	for _, r := range e.Refs {
		if _, ok := c.Holds(r.TypeURL, r.Name); !ok {
			return "waiting for " + r.Name, nil
		}
	}
	return "", nil
}

// A name no longer served is kept while the client holds a version, no longer served either, of
// something that references it: a cluster switched from endpoints e1 to e2 waits until the client
// has e2, and until the client has taken the new cluster, e1 (which the cache no longer serves)
// stays with it.
func TestANameStaysWhileAVersionTheClientHoldsNoLongerServedReferencesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{resourcev3.ClusterType, resourcev3.EndpointType})
		defer c.Close()
		c.SetWithholder(makeBeforeBreak{})
		tr := NewTracker(c)
		cluster := func(version, eds string) *Entry {
			e := clusterEntry(t, "c", version)
			e.Refs = []Ref{{TypeURL: resourcev3.EndpointType, Name: eds}}
			return e
		}
		endpoints := func(name string) *Entry {
			a, err := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: name})
			g.Expect(err).NotTo(HaveOccurred())
			return &Entry{TypeURL: resourcev3.EndpointType, Name: name, Version: "1", Any: a,
				Wire: &discovery.Resource{Name: name, Version: "1", Resource: a}}
		}
		c.SetSnapshot(SnapshotOf([]*Entry{cluster("1", "e1"), endpoints("e1")}))
		cl := openClient(t, c, tr, 1, "node-1", false)
		g.Expect(cl.ask(resourcev3.EndpointType, nil, "")).To(Succeed())
		expectSent(t, cl.ackAll(resourcev3.EndpointType, nil), []string{"e1"})
		g.Expect(cl.ask(resourcev3.ClusterType, nil, "")).To(Succeed())
		expectSent(t, cl.ackAll(resourcev3.ClusterType, nil), []string{"c"})

		c.SetSnapshot(c.Snapshot().Update([]*Entry{cluster("2", "e2"), endpoints("e2")}, map[string][]string{resourcev3.EndpointType: {"e1"}}))
		expectSent(t, cl.take(resourcev3.ClusterType), nil, "c@2 waits for e2")
		r := cl.ackAll(resourcev3.EndpointType, nil)
		expectSent(t, r, []string{"e2"})
		g.Expect(r.removed).To(BeEmpty(), "e1 stays: the client's c@1 references it")

		expectSent(t, cl.ackAll(resourcev3.ClusterType, nil), []string{"c"}, "c@2, once the client has e2")
		r = cl.ackAll(resourcev3.EndpointType, nil)
		g.Expect(r).NotTo(BeNil())
		g.Expect(r.removed).To(Equal([]string{"e1"}), "then e1 goes")
	})
}

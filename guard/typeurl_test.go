package guard_test

import (
	"context"
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/guard"
)

// A cache may serve a message under a type URL of its own, not the message's name (kds-host's
// kinds, Kuma's KDS types): a LinearCache of clusters as "widgets". The guard names and reads
// each resource from the cache's RawResponse instead of decoding it by its type URL, so both a
// SotW and a delta client get every widget, and a change.
func TestGuardServesATypeURLOfItsOwn(t *testing.T) {
	g := NewWithT(t)
	const widgets = "example.com/widgets"
	lc := cache.NewLinearCache(widgets, cache.WithInitialResources(map[string]types.Resource{
		"a": edsCluster("a", cluster.Cluster_ROUND_ROBIN), "b": edsCluster("b", cluster.Cluster_ROUND_ROBIN)}))
	gd, err := guard.New(lc, guard.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer gd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(serve(t, ctx, gd, gd.Callbacks(nil)))

	sotw, err := ads.StreamAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sotw.Send(&discovery.DiscoveryRequest{Node: nodeOf("sotw"), TypeUrl: widgets})).To(Succeed())
	delta, err := ads.DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(delta.Send(&discovery.DeltaDiscoveryRequest{Node: nodeOf("delta"), TypeUrl: widgets})).To(Succeed())

	sotwNext := func() (names []string, lb []cluster.Cluster_LbPolicy) {
		t.Helper()
		r, err := recvWithin(func() (*discovery.DiscoveryResponse, error) { return sotw.Recv() })
		g.Expect(err).NotTo(HaveOccurred())
		for _, a := range r.GetResources() {
			c := &cluster.Cluster{}
			g.Expect(proto.Unmarshal(a.GetValue(), c)).To(Succeed()) // the Any's type URL is the cache's
			names, lb = append(names, c.GetName()), append(lb, c.GetLbPolicy())
		}
		g.Expect(sotw.Send(&discovery.DiscoveryRequest{TypeUrl: widgets, VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()})).To(Succeed())
		slices.Sort(names)
		return names, lb
	}
	deltaNext := func() (names []string) {
		t.Helper()
		r, err := recvWithin(func() (*discovery.DeltaDiscoveryResponse, error) { return delta.Recv() })
		g.Expect(err).NotTo(HaveOccurred())
		for _, x := range r.GetResources() {
			names = append(names, x.GetName())
		}
		g.Expect(delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: widgets, ResponseNonce: r.GetNonce()})).To(Succeed())
		slices.Sort(names)
		return names
	}

	names, _ := sotwNext()
	g.Expect(names).To(Equal([]string{"a", "b"}))
	g.Expect(deltaNext()).To(Equal([]string{"a", "b"}))

	g.Expect(lc.UpdateResource("b", edsCluster("b", cluster.Cluster_LEAST_REQUEST))).To(Succeed())
	names, lb := sotwNext() // only b: a type but LDS and CDS is not full state in SotW
	g.Expect(names).To(Equal([]string{"b"}))
	g.Expect(lb).To(Equal([]cluster.Cluster_LbPolicy{cluster.Cluster_LEAST_REQUEST}))
	g.Expect(deltaNext()).To(Equal([]string{"b"}), "a delta client gets what changed")

	// The LinearCache answered the guard's watch with b alone: the guard still holds a. A new
	// SotW client gets both; a change to a reaches both clients, and a removal the delta one.
	late, err := ads.StreamAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(late.Send(&discovery.DiscoveryRequest{Node: nodeOf("late"), TypeUrl: widgets})).To(Succeed())
	r, err := recvWithin(func() (*discovery.DiscoveryResponse, error) { return late.Recv() })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.GetResources()).To(HaveLen(2))
	g.Expect(lc.UpdateResource("a", edsCluster("a", cluster.Cluster_RANDOM))).To(Succeed())
	names, lb = sotwNext()
	g.Expect(names).To(Equal([]string{"a"}))
	g.Expect(lb).To(Equal([]cluster.Cluster_LbPolicy{cluster.Cluster_RANDOM}))
	g.Expect(deltaNext()).To(Equal([]string{"a"}))
	// A removal alone wakes no SotW watch of such a type (go-control-plane's LinearCache cannot
	// say it): the guard hears of it with the type's next change, and so does a delta client.
	g.Expect(lc.DeleteResource("b")).To(Succeed())
	g.Expect(lc.UpdateResource("a", edsCluster("a", cluster.Cluster_MAGLEV))).To(Succeed())
	dr, err := recvWithin(func() (*discovery.DeltaDiscoveryResponse, error) { return delta.Recv() })
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(dr.GetRemovedResources()).To(Equal([]string{"b"}))
	g.Expect(dr.GetResources()).To(HaveLen(1))
	g.Expect(dr.GetResources()[0].GetName()).To(Equal("a"))
}

// recvWithin receives one message, or fails after 10 s.
func recvWithin[M any](recv func() (M, error)) (M, error) {
	type got struct {
		m   M
		err error
	}
	c := make(chan got, 1)
	go func() { m, err := recv(); c <- got{m, err} }()
	select {
	case r := <-c:
		return r.m, r.err
	case <-time.After(10 * time.Second):
		var zero M
		return zero, context.DeadlineExceeded
	}
}

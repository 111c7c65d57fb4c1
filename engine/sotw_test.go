package engine

import (
	"context"
	"testing"
	"testing/synctest"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine/event"
)

// clusterEntry is a Cluster named name at version.
func clusterEntry(t *testing.T, name, version string) *Entry {
	a, err := anypb.New(&cluster.Cluster{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return &Entry{TypeURL: resourcev3.ClusterType, Name: name, Version: version, Any: a,
		Wire: &discovery.Resource{Name: name, Version: version, Resource: a}}
}

// A SotW response of Clusters made while the client's NACK of the one before is on its way
// carries the cluster the client refuses again (its full state): the client's NACK of it, naming
// that cluster as grpc-go does, refuses that cluster alone, not the good cluster's new version
// the response brought.
func TestASotWNACKIsReadAgainstTheWholeStateItsResponseCarried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{resourcev3.ClusterType})
		defer c.Close()
		var nacks []event.NACK
		tr := NewTracker(c, event.Observer{NACK: func(n event.NACK) { nacks = append(nacks, n) }})
		c.SetSnapshot(SnapshotOf([]*Entry{clusterEntry(t, "bad", "1"), clusterEntry(t, "good", "1")}))

		ctx := context.Background()
		g.Expect(tr.OnStreamOpen(ctx, 1, "")).To(Succeed())
		defer tr.OnStreamClosed(1, nil)
		sub := stream.NewSotwSubscription(nil, true) // a wildcard: every cluster
		out := make(chan cache.Response, 1)
		// request opens a watch as the SotW server does for req (the request callback, then the
		// watch), and returns its cancel.
		request := func(req *discovery.DiscoveryRequest) func() {
			g.Expect(tr.OnStreamRequest(1, req)).To(Succeed())
			cancel, err := c.CreateWatch(req, sub, out)
			g.Expect(err).NotTo(HaveOccurred())
			return cancel
		}
		// send plays the server sending the response the watch made, numbered nonce.
		send := func(nonce string) *discovery.DiscoveryResponse {
			synctest.Wait()
			var resp cache.Response
			g.Expect(out).To(Receive(&resp))
			dr, err := resp.GetDiscoveryResponse()
			g.Expect(err).NotTo(HaveOccurred())
			dr.Nonce = nonce
			tr.OnStreamResponse(ctx, 1, resp.GetRequest(), dr)
			return dr
		}
		refusal := &rpcstatus.Status{Code: 3, Message: `error parsing "1" response: resource "bad": unexpected lbPolicy MAGLEV in response`}

		first := request(&discovery.DiscoveryRequest{Node: &core.Node{Id: "node-1"}, TypeUrl: resourcev3.ClusterType})
		g.Expect(send("1").GetResources()).To(HaveLen(2), "bad and good")
		// A request read before the client's NACK of "1" opens the next watch, and the good
		// cluster changes: the full state sent carries bad again, with good's new version.
		first()
		request(&discovery.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
		c.SetSnapshot(c.Snapshot().Update([]*Entry{clusterEntry(t, "good", "2")}, nil))
		g.Expect(send("2").GetResources()).To(HaveLen(2), "bad again, and good's new version")

		request(&discovery.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: "1", ErrorDetail: refusal})
		request(&discovery.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: "2", ErrorDetail: refusal})

		g.Expect(nacks).To(HaveLen(2))
		for i, n := range nacks {
			g.Expect(n.Rejected).To(HaveLen(1), "NACK %d", i+1)
			g.Expect(n.Rejected[0].Name).To(Equal("bad"), "NACK %d: the cluster it names, not what the response brought new", i+1)
		}
		g.Expect(nacks[1].Accepted).To(Equal(map[string]string{"good": "2"}))
		s := c.Session(sotwID(1))
		v, ok := s.AckedVersion(resourcev3.ClusterType, "good")
		g.Expect(ok).To(BeTrue())
		g.Expect(v).To(Equal("2"), "the client holds good's new version")
		_, ok = s.AckedVersion(resourcev3.ClusterType, "bad")
		g.Expect(ok).To(BeFalse(), "it holds no version of bad")
		g.Expect(s.Insight()[0].Rejected).To(HaveLen(1))
	})
}

package kds_test

import (
	"context"
	"strconv"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/kds-host/kds-host/engine"
	. "github.com/onsi/gomega"
)

// A zone that never answers cannot grow the global's memory: what the global keeps of the
// responses in flight on a stream is bounded, the oldest forgotten first.
func TestResponsesInFlightAreBounded(t *testing.T) {
	g := NewWithT(t)
	c := engine.NewCache([]string{"MeshTimeout"})
	defer c.Close()
	tr := engine.NewTracker(c)
	g.Expect(tr.OnDeltaStreamOpen(context.Background(), 1, "")).To(Succeed())
	g.Expect(tr.OnStreamDeltaRequest(1, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "z"}, TypeUrl: "MeshTimeout"})).To(Succeed())
	for i := range 10_000 {
		tr.OnStreamDeltaResponse(1, nil, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: strconv.Itoa(i + 1),
			Resources: []*discovery.Resource{{Name: "m/a", Version: strconv.Itoa(i)}}})
	}
	g.Expect(c.Session(1).InFlight()).To(BeNumerically("<=", engine.MaxInFlight))
	tr.OnDeltaStreamClosed(1, nil)
}

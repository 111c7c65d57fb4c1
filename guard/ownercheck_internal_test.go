package guard

import (
	"context"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// gatedCheck is the reference owner check, each prediction held until release.
type gatedCheck struct {
	shared.OwnerCheck
	asked   chan *pluginv1.PredictRequest
	release chan struct{}
}

func (c gatedCheck) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	c.asked <- req
	<-c.release
	return c.OwnerCheck.Predict(ctx, req)
}

// A check judges what the client held when it started. When the client ACKs meanwhile, the ACK
// may be what a WAIT waits for, and the client may send no other (it waits for the route): such a
// verdict is not kept, and the version, left without one, is asked about again. An ACCEPT is kept.
// Without an ACK meanwhile, the WAIT is kept until the next one.
func TestAVerdictOnWhatTheClientNoLongerHoldsIsNotKept(t *testing.T) {
	for _, ackMeanwhile := range []bool{true, false} {
		g := NewWithT(t)
		check := gatedCheck{OwnerCheck: ownerpredict.New(), asked: make(chan *pluginv1.PredictRequest, 1), release: make(chan struct{})}
		gd, err := New(cache.NewSnapshotCache(true, cache.IDHash{}, nil), Options{NoHolds: true, OwnerCheck: func() shared.OwnerCheck { return check }})
		g.Expect(err).NotTo(HaveOccurred())
		s := newSession(gd, 1, false)
		go s.run()

		c1 := &item{name: "c1", version: "1"}
		r := &item{name: "r", version: "1", refs: []Ref{{TypeURL: resource.ClusterType, Name: "c1"}}}
		s.mu.Lock()
		clusters, routes := s.typeOf(resource.ClusterType), s.typeOf(resource.RouteType)
		clusters.sub, routes.sub = stream.NewSotwSubscription(nil, true), stream.NewSotwSubscription([]string{"r"}, true)
		clusters.served, routes.served = (*served)(nil).fold(resource.ClusterType, []*item{c1}, "1", nil, true), (*served)(nil).fold(resource.RouteType, []*item{r}, "1", nil, true)
		s.owner.need = true
		s.checkOwnersLocked() // c1 and r, with nothing held: c1 ACCEPT, r WAIT for c1
		s.mu.Unlock()

		req := <-check.asked
		g.Expect(req.GetCandidates()).To(HaveLen(2))
		g.Expect(req.GetInventory()).To(BeEmpty())
		if ackMeanwhile {
			s.mu.Lock()
			clusters.acked.set("c1", c1) // the client's ACK of c1, while the check runs
			s.ownerArrivedLocked()
			s.mu.Unlock()
		}
		close(check.release)
		s.wg.Wait()

		s.mu.Lock()
		g.Expect(clusters.verdicts).To(HaveKeyWithValue("c1", ownerVerdict{version: "1", ok: true}))
		wait, kept := routes.verdicts["r"]
		g.Expect(kept).To(Equal(!ackMeanwhile), "ACK meanwhile: %v", ackMeanwhile)
		if kept {
			g.Expect(wait.ok).To(BeFalse())
		}
		s.mu.Unlock()
		s.close()
		gd.Close()
	}
}

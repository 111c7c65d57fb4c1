package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/policy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// deaf is an in-process policy that ignores its context: each call waits until release is
// closed. It counts the calls made and those that returned.
type deaf struct {
	shared.RetryForcer // Configure: not called
	release            chan struct{}
	made, returned     atomic.Int64
}

func newDeaf() *deaf { return &deaf{release: make(chan struct{})} }

func (d *deaf) wait() {
	d.made.Add(1)
	<-d.release
	d.returned.Add(1)
}

// running is how many calls have not returned.
func (d *deaf) running() int64 { return d.made.Load() - d.returned.Load() }

func (d *deaf) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "deaf"}, nil
}

func (d *deaf) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	d.wait()
	return nil, errors.New("too late")
}

func (d *deaf) Predict(context.Context, *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	d.wait()
	return nil, errors.New("too late")
}

// A retry policy that ignores its context is given up on at its deadline, and the built-in
// policy decides: each stream's refused cluster is sent again. However many decisions, at most
// policy.MaxAbandoned of its calls run on at once; a decision while that many do is not asked of
// it at all.
func TestARetryPolicyThatIgnoresItsContextRunsOnAtMostMaxAbandonedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		d := newDeaf()
		defer close(d.release)
		h := newGuardedServer(t, Options{RetryPolicy: func() shared.RetryForcer { return d }})
		h.set(map[resource.Type][]types.Resource{resource.ClusterType: {eds("a")}})
		const streams = 10
		for i := range streams {
			c := h.delta()
			c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})
			rs := c.received()
			g.Expect(rs).To(HaveLen(1))
			c.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: rs[0].GetNonce(),
				ErrorDetail: &rpcstatus.Status{Code: 3, Message: `resource "a": refused`}})
			time.Sleep(5 * time.Second) // the policy's deadline, and the built-in policy's round
			g.Expect(c.received()).To(ContainElement(HaveField("Resources", HaveLen(1))), "stream %d: the refused cluster is sent again", i)
			g.Expect(d.running()).To(BeNumerically("<=", policy.MaxAbandoned), "after %d decisions", i+1)
		}
		g.Expect(d.made.Load()).To(BeEquivalentTo(policy.MaxAbandoned), "asked while fewer than MaxAbandoned of its calls ran on")
	})
}

// An owner check that ignores its context is given up on at its deadline: the client gets what
// it asks for (fail-open).
func TestAnOwnerCheckThatIgnoresItsContextIsGivenUpOnAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		d := newDeaf()
		defer close(d.release)
		h := newGuardedServer(t, Options{OwnerCheck: func() shared.OwnerCheck { return d }})
		h.set(map[resource.Type][]types.Resource{resource.ClusterType: {eds("a")}})
		c := h.delta()
		c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})
		g.Expect(c.received()).To(BeEmpty(), "the owner check runs")
		time.Sleep(time.Second) // OwnerCheckTimeout's default
		g.Expect(c.received()).To(ConsistOf(HaveField("Resources", HaveLen(1))), "given up on: fail-open")
		g.Expect(d.running()).To(BeEquivalentTo(1), "the call runs on")
	})
}

// Closing a stream does not wait for an owner check that ignores its context.
func TestClosingAStreamDoesNotWaitForAnOwnerCheckThatIgnoresItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		d := newDeaf()
		defer close(d.release)
		h := newGuardedServer(t, Options{OwnerCheck: func() shared.OwnerCheck { return d }})
		h.set(map[resource.Type][]types.Resource{resource.ClusterType: {eds("a")}})
		c := h.delta()
		c.send(&discovery.DeltaDiscoveryRequest{Node: clientNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})
		synctest.Wait()
		g.Expect(d.running()).To(BeEquivalentTo(1), "the owner check runs")
		closed := make(chan struct{})
		go func() {
			c.stop()
			close(closed)
		}()
		synctest.Wait()
		g.Expect(closed).To(BeClosed(), "the stream closed without waiting for the owner check")
	})
}

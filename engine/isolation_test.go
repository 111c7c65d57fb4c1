package engine

import (
	"context"
	"net"
	"testing"
	"testing/synctest"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/resource"
)

// stuckZone is the stream of a zone that subscribes to kind and reads nothing: as grpc-go's, its
// Send takes what it is given while less than 64 KiB is unwritten (a stream's write quota), and
// then waits, here until the stream ends.
func stuckZone(c *Cache, tr *Tracker, id int64, zone string, kind string) *loopZone {
	ctx, cancel := context.WithCancelCause(context.Background())
	z := &loopZone{done: make(chan error, 1), cancel: func() { cancel(nil) }}
	z.str = &fakeStream{ctx: ctx, reqs: make(chan *discovery.DeltaDiscoveryRequest), sent: make(chan *discovery.DeltaDiscoveryResponse, 8)}
	quota := 64 << 10
	z.str.onSend = func() error {
		if quota <= 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		quota -= 1 << 20 // what the test sends it
		return nil
	}
	sctx := context.WithValue(ctx, streamKey{}, &streamInfo{node: zone, close: cancel, loop: true})
	go func() { z.done <- serveDelta(sctx, id, z.str, c, tr) }()
	z.str.reqs <- &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: zone}, TypeUrl: kind, ResourceNamesSubscribe: []string{"*"}}
	return z
}

// Zones that stop reading hold what they were sent, and no more: a healthy zone's write that
// fits in its stream's share of the budget goes at once, however many of them fill the rest, and
// each of them is closed with its reason when the response timeout passes, and counted.
func TestAZoneThatStopsReadingOnlyHurtsItself(t *testing.T) {
	for _, slow := range []int{5, 50} {
		synctest.Test(t, func(t *testing.T) {
			g := NewWithT(t)
			c := NewCache([]string{"MeshTimeout", "MeshAccessLog"})
			defer c.Close()
			var refusals []event.Refusal
			refused := make(chan event.Refusal, slow)
			tr := NewTracker(c, event.Observer{Refused: func(r event.Refusal) { refused <- r }})
			tr.SetLimits(Limits{MaxInFlightBytes: 256 << 10})
			var b testSnapshots
			big := make([]resource.Resource, 8) // a kind of 1 MiB, in one response
			for i := range big {
				big[i] = policyAt("MeshAccessLog", string(rune('a'+i)), 1, 128<<10)
			}
			s, err := b.Build(append(big, policyAt("MeshTimeout", "t", 1, 0)))
			g.Expect(err).NotTo(HaveOccurred())
			c.SetSnapshot(s)

			healthy := startLoopZone(c, tr, 1, "healthy") // MeshTimeout
			synctest.Wait()
			healthy.ack(<-healthy.str.sent)
			var stuck []*loopZone
			for i := range slow {
				stuck = append(stuck, stuckZone(c, tr, int64(2+i), "slow-"+string(rune('A'+i)), "MeshAccessLog"))
			}
			synctest.Wait()
			g.Expect(c.budget.inUse()).To(BeNumerically(">=", 1<<20), "the first took the pool, alone")

			start := time.Now()
			for gen := int64(2); gen <= 6; gen++ {
				s, err = b.Update([]resource.Resource{policyAt("MeshTimeout", "t", gen, 0)}, nil)
				g.Expect(err).NotTo(HaveOccurred())
				c.SetSnapshot(s)
				synctest.Wait()
				g.Expect(healthy.str.sent).To(HaveLen(1), "write %d is sent at once", gen)
				healthy.ack(<-healthy.str.sent)
			}
			g.Expect(time.Since(start)).To(BeZero(), "no write waited")

			time.Sleep(DefaultLimits().ResponseTimeout)
			synctest.Wait()
			for range len(refused) {
				refusals = append(refusals, <-refused)
			}
			g.Expect(refusals).To(ContainElement(And(
				HaveField("Reason", "stalled"), HaveField("Node", HavePrefix("slow-")),
				HaveField("Detail", ContainSubstring("has not answered a MeshAccessLog response for 30s")))),
				"the zone that took the pool is closed at the timeout")
			closed := 0
			for _, z := range stuck {
				if len(z.done) == 1 {
					closed++
					g.Expect(status.Code(context.Cause(z.str.ctx))).To(Equal(codes.DeadlineExceeded))
				}
			}
			g.Expect(closed).To(Equal(len(refusals)), "each closed with its reason")

			healthy.cancel()
			g.Expect(<-healthy.done).To(Succeed())
			for _, z := range stuck {
				z.cancel()
				<-z.done
			}
		})
	}
}

// The response timeout runs from the oldest response the zone has not answered, not from the
// stream's first: a zone that answers, slowly, is not closed.
func TestTheResponseTimeoutRunsFromTheOldestUnansweredResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		tr.SetLimits(Limits{ResponseTimeout: 30 * time.Second})
		var b testSnapshots
		s, err := b.Build([]resource.Resource{policyAt("MeshTimeout", "t", 1, 0)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)
		z := startLoopZone(c, tr, 1, "z")
		synctest.Wait()
		first := <-z.str.sent
		time.Sleep(20 * time.Second)
		z.ack(first)
		time.Sleep(5 * time.Second)
		s, err = b.Update([]resource.Resource{policyAt("MeshTimeout", "t", 2, 0)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s) // at 25 s, never answered
		synctest.Wait()
		<-z.str.sent

		time.Sleep(30*time.Second - time.Nanosecond) // 55 s - 1 ns: the stream's first timer fired at 30 s
		synctest.Wait()
		g.Expect(z.done).To(BeEmpty())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		g.Expect(z.done).To(HaveLen(1))
		g.Expect(status.Code(context.Cause(z.str.ctx))).To(Equal(codes.DeadlineExceeded))
	})
}

// A zone that closes its side of the stream while its window is full ends the stream at once:
// nothing of the stream waits for a send that waits for the zone.
func TestAZoneThatHalfClosesWithAFullWindowEndsItsStream(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := NewCache([]string{"MeshAccessLog", "MeshTimeout"})
	defer c.Close()
	closed := make(chan string, 1)
	tr := NewTracker(c, event.Observer{StreamClosed: func(_ int64, zone string) { closed <- zone }})
	var b testSnapshots
	var big []resource.Resource
	for i := range 16 { // 2 MiB: a response and more that the zone's window does not take
		big = append(big, policyAt("MeshAccessLog", string(rune('a'+i)), 1, 128<<10))
	}
	s, err := b.Build(append(big, policyAt("MeshTimeout", "t", 1, 0)))
	g.Expect(err).NotTo(HaveOccurred())
	c.SetSnapshot(s)
	str := nonReadingZone(t, ctx, c, tr, ADSConfig{}, "MeshAccessLog")
	g.Eventually(func() int {
		if st := c.Current("z"); st != nil {
			return st.InFlight()
		}
		return 0
	}, 10*time.Second).Should(Equal(1), "sent, and not read")
	// A second kind: its response waits for the zone to read the first.
	g.Expect(str.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"*"}})).To(Succeed())
	g.Eventually(func() int { return c.Current("z").InFlight() }, 10*time.Second).Should(Equal(2))

	g.Expect(str.CloseSend()).To(Succeed())
	g.Eventually(closed, 10*time.Second).Should(Receive(Equal("z")), "the stream ended")
	g.Expect(c.budget.inUse()).To(BeZero())
}

// A zone that does not read is disconnected at the response timeout: its stream's status waits
// behind what it does not read, and so does what gRPC holds for it, so the global drops its
// connection (ADSConfig.Conns), and says so.
func TestAStalledZonesConnectionIsDropped(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := NewCache([]string{"MeshAccessLog"})
	defer c.Close()
	refused := make(chan event.Refusal, 1)
	tr := NewTracker(c, event.Observer{Refused: func(r event.Refusal) { refused <- r }})
	tr.SetLimits(Limits{ResponseTimeout: 200 * time.Millisecond})
	var b testSnapshots
	var big []resource.Resource
	for i := range 8 { // 1 MiB: more than the zone's window takes
		big = append(big, policyAt("MeshAccessLog", string(rune('a'+i)), 1, 128<<10))
	}
	s, err := b.Build(big)
	g.Expect(err).NotTo(HaveOccurred())
	c.SetSnapshot(s)
	str := nonReadingZone(t, ctx, c, tr, ADSConfig{Conns: NewConns()}, "MeshAccessLog")

	var r event.Refusal
	g.Eventually(refused, 10*time.Second).Should(Receive(&r))
	g.Expect(r.Reason).To(Equal("stalled"))
	g.Expect(r.Detail).To(And(ContainSubstring(`zone "z" has not answered a MeshAccessLog response for 200ms`), ContainSubstring("its connection is closed")))
	g.Eventually(func() error {
		return str.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "MeshAccessLog"})
	}, 10*time.Second).Should(HaveOccurred(), "the zone sees its connection end")
	g.Expect(c.budget.inUse()).To(BeZero())
}

// nonReadingZone serves c (DeltaADS) on a loopback listener with cfg and opens a stream to it as zone z,
// subscribed to kind, over the smallest windows there are, which never reads: the server's
// sends to it wait.
func nonReadingZone(t *testing.T, ctx context.Context, c *Cache, tr *Tracker, cfg ADSConfig, kind string) discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	g := NewWithT(t)
	opts := []grpc.ServerOption{grpc.ForceServerCodecV2(c.Codec())}
	if cfg.Conns != nil {
		opts = append(opts, grpc.Creds(cfg.Conns.Creds(nil)))
	}
	srv := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, c.DeltaADS(ctx, tr, cfg))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStaticStreamWindowSize(64<<10), grpc.WithStaticConnWindowSize(64<<10))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { conn.Close() })
	str, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(str.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "z"}, TypeUrl: kind, ResourceNamesSubscribe: []string{"*"}})).To(Succeed())
	return str
}

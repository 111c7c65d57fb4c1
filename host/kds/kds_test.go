package kds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/nack"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// harness is a real KDS gRPC server on loopback and a raw delta ADS client stream.
type harness struct {
	t      *testing.T
	cache  *engine.Cache
	zones  *engine.Nodes
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	in     chan *discovery.DeltaDiscoveryResponse // what the one reader goroutine received
	ended  chan error                             // the stream's end, once the reader saw it
	conn   *grpc.ClientConn
	ctx    context.Context
	b      kds.SnapshotBuilder
	server kds.ServerConfig // what NewGRPCServer is given: a tune may set it
}

// newHarness serves kinds; each tune, if any, sets up the tracker before it serves.
func newHarness(t *testing.T, kinds []string, tune ...func(h *harness) *engine.Tracker) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, cache: engine.NewCache(kinds)}
	h.zones = engine.NewNodes(h.cache)
	tracker := engine.NewTracker(h.cache, h.zones.Observer())
	for _, f := range tune {
		tracker = f(h)
	}
	srv, _ := kds.NewGRPCServer(ctx, h.cache, tracker, h.server)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.conn, h.ctx = conn, ctx
	h.open(t)
	t.Cleanup(func() {
		conn.Close()
		cancel()
		srv.Stop()
		h.cache.Close()
	})
	return h
}

// open opens h's stream on its connection, with its reader; both end with the test.
func (h *harness) open(t *testing.T) {
	sctx, scancel := context.WithCancel(h.ctx)
	var err error
	h.stream, err = discovery.NewAggregatedDiscoveryServiceClient(h.conn).DeltaAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	h.in = make(chan *discovery.DeltaDiscoveryResponse, 100)
	h.ended = make(chan error, 1)
	readerDone := make(chan struct{})
	in, ended, stream := h.in, h.ended, h.stream
	go func() {
		defer close(readerDone)
		for {
			r, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			in <- r
		}
	}()
	t.Cleanup(func() {
		scancel()
		<-readerDone
	})
}

// reconnect is a second stream to the same server, over the same connection (the zone comes
// back: the server replaces its first stream).
func (h *harness) reconnect(t *testing.T) *harness {
	h2 := *h
	h2.open(t)
	return &h2
}

func (h *harness) set(rs []resource.Resource) {
	h.t.Helper()
	s, err := h.b.Build(rs)
	if err != nil {
		h.t.Fatal(err)
	}
	h.cache.SetSnapshot(s)
}

func (h *harness) subscribe(kinds ...string) {
	h.t.Helper()
	for i, k := range kinds {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: k}
		if i == 0 {
			req.Node = &core.Node{Id: "zone-1"}
		}
		if err := h.stream.Send(req); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *harness) recv() *discovery.DeltaDiscoveryResponse {
	h.t.Helper()
	select {
	case r := <-h.in:
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatal("no response within 10s")
	}
	return nil
}

func (h *harness) ack(r *discovery.DeltaDiscoveryResponse) {
	h.t.Helper()
	if err := h.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) nack(r *discovery.DeltaDiscoveryResponse, names ...string) {
	h.t.Helper()
	list := &kdsv1.RejectionList{Kind: r.TypeUrl}
	for _, n := range names {
		list.Rejections = append(list.Rejections, &kdsv1.Rejection{Name: n, Reason: "no"})
	}
	detail, err := nack.Detail(list, "rejected")
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce, ErrorDetail: detail}); err != nil {
		h.t.Fatal(err)
	}
}

// expectQuiet asserts that nothing arrives for a while (the server has nothing to send).
func (h *harness) expectQuiet(d time.Duration) {
	h.t.Helper()
	select {
	case r := <-h.in:
		h.t.Fatalf("unexpected response for %s with %d resources", r.TypeUrl, len(r.Resources))
	case <-time.After(d):
	}
}

func policy(kind, mesh, name, spec string) resource.Resource {
	return resource.Resource{Kind: kind, Mesh: mesh, Name: name, Spec: json.RawMessage(spec), Generation: 1}
}

func TestManyKindsOnOneStreamDoNotDeadlock(t *testing.T) {
	g := NewWithT(t)
	const kinds, perKind = 40, 100
	names := []string{"Mesh"}
	var rs []resource.Resource
	rs = append(rs, resource.Resource{Kind: "Mesh", Name: "default", Spec: json.RawMessage(`{}`), Generation: 1})
	for k := range kinds {
		kind := fmt.Sprintf("Kind%02d", k)
		names = append(names, kind)
		for i := range perKind {
			rs = append(rs, policy(kind, "default", fmt.Sprintf("p-%d", i), `{"x":1}`))
		}
	}
	h := newHarness(t, names)
	h.set(rs)
	// Subscribe to every kind before reading anything: the server has 41 responses to send on a
	// channel of 20 slots, and must not deadlock.
	h.subscribe(names...)
	got := map[string]int{}
	for range names {
		r := h.recv()
		got[r.TypeUrl] += len(r.Resources)
		h.ack(r)
	}
	g.Expect(got).To(HaveLen(kinds + 1))
	for _, k := range names[1:] {
		g.Expect(got[k]).To(Equal(perKind), k)
	}
	// The first response is the owner kind, whatever the scheduling.
	g.Eventually(func() int { return len(h.zones.Inventory("zone-1")) }).Should(Equal(kinds*perKind + 1))
}

func TestOwnerKindIsSentFirstWhenReadyTogether(t *testing.T) {
	g := NewWithT(t)
	names := []string{"Mesh", "MeshTimeout", "MeshRetry"}
	h := newHarness(t, names)
	h.subscribe("MeshRetry", "MeshTimeout", "Mesh") // subscribed in reverse, before anything exists
	h.expectQuiet(100 * time.Millisecond)
	h.set([]resource.Resource{
		policy("MeshRetry", "default", "r", `{}`),
		policy("MeshTimeout", "default", "t", `{}`),
		{Kind: "Mesh", Name: "default", Spec: json.RawMessage(`{}`), Generation: 1},
	})
	var order []string
	for range names {
		r := h.recv()
		order = append(order, r.TypeUrl)
		h.ack(r)
	}
	g.Expect(order).To(Equal(names))
}

func TestNACKedNamesAreNotResentUntilForcedOrChanged(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, []string{"Mesh", "MeshTimeout"})
	h.set([]resource.Resource{policy("MeshTimeout", "default", "a", `{"v":1}`), policy("MeshTimeout", "default", "b", `{"v":1}`)})
	h.subscribe("MeshTimeout")
	r := h.recv()
	g.Expect(r.Resources).To(HaveLen(2))
	h.nack(r, "default/a")
	h.expectQuiet(200 * time.Millisecond)
	g.Expect(h.zones.Inventory("zone-1")).To(ConsistOf(engine.Ref{TypeURL: "MeshTimeout", Name: "default/b"}))

	// A forced resend sends exactly the rejected name, at the same version.
	h.cache.Resend(1, map[string][]string{"MeshTimeout": {"default/a"}})
	r2 := h.recv()
	g.Expect(r2.Resources).To(HaveLen(1))
	g.Expect(r2.Resources[0].Name).To(Equal("default/a"))
	g.Expect(r2.Resources[0].Version).To(Equal(r.Resources[0].Version))
	h.nack(r2, "default/a")
	h.expectQuiet(200 * time.Millisecond)

	// A content change is sent at once.
	h.set([]resource.Resource{policy("MeshTimeout", "default", "a", `{"v":2}`), policy("MeshTimeout", "default", "b", `{"v":1}`)})
	r3 := h.recv()
	g.Expect(r3.Resources).To(HaveLen(1))
	g.Expect(r3.Resources[0].Name).To(Equal("default/a"))
	h.ack(r3)
	g.Eventually(func() []engine.Ref { return h.zones.Inventory("zone-1") }).Should(HaveLen(2))

	// A deletion is sent as a removal.
	h.set([]resource.Resource{policy("MeshTimeout", "default", "b", `{"v":1}`)})
	r4 := h.recv()
	g.Expect(r4.RemovedResources).To(Equal([]string{"default/a"}))
}

func TestNACKWithoutRejectionListRejectsTheWholeResponse(t *testing.T) {
	g := NewWithT(t)
	var nacks []event.NACK
	obs := event.Observer{NACK: func(n event.NACK) { nacks = append(nacks, n) }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := engine.NewCache([]string{"MeshTimeout"})
	defer c.Close()
	tr := engine.NewTracker(c, obs)
	g.Expect(tr.OnDeltaStreamOpen(ctx, 7, "")).To(Succeed())
	g.Expect(tr.OnStreamDeltaRequest(7, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "z"}, TypeUrl: "MeshTimeout"})).To(Succeed())
	tr.OnStreamDeltaResponse(7, nil, &discovery.DeltaDiscoveryResponse{TypeUrl: "MeshTimeout", Nonce: "1",
		Resources: []*discovery.Resource{{Name: "m/a", Version: "1"}, {Name: "m/b", Version: "1"}}})
	g.Expect(tr.OnStreamDeltaRequest(7, &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResponseNonce: "1",
		ErrorDetail: statusMessage("webhook down")})).To(Succeed())
	g.Expect(nacks).To(HaveLen(1))
	g.Expect(nacks[0].Rejected).To(Equal([]event.Rejection{{Name: "m/a", Version: "1", Reason: "webhook down"}, {Name: "m/b", Version: "1", Reason: "webhook down"}}))
	g.Expect(nacks[0].Accepted).To(BeEmpty())
	tr.OnDeltaStreamClosed(7, nil)
}

func TestARequestWithoutATypeURLIsRefused(t *testing.T) {
	g := NewWithT(t)
	c := engine.NewCache([]string{"Mesh"})
	defer c.Close()
	tr := engine.NewTracker(c)
	g.Expect(tr.OnDeltaStreamOpen(context.Background(), 1, "")).To(Succeed())
	err := tr.OnStreamDeltaRequest(1, &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "z"}})
	g.Expect(err).To(MatchError(ContainSubstring("type_url is required")))
	tr.OnDeltaStreamClosed(1, nil)
}

// A kind larger than one message goes in as many responses as it takes, each under the limit and
// each sent once the zone answered the one before; a resource larger than the limit goes alone.
// Removals are bounded the same way.
func TestAKindLargerThanAMessageGoesInSeveralResponses(t *testing.T) {
	g := NewWithT(t)
	const limit = 64 << 10
	h := newHarness(t, []string{"MeshTimeout"}, func(h *harness) *engine.Tracker {
		tr := engine.NewTracker(h.cache, h.zones.Observer())
		tr.SetLimits(engine.Limits{MaxMessage: limit})
		return tr
	})
	big := func(name string, n int) resource.Resource {
		return policy("MeshTimeout", "default", name, fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", n)))
	}
	var rs []resource.Resource
	for i := range 17 {
		rs = append(rs, big(fmt.Sprintf("p%02d", i), 20<<10))
	}
	rs = append(rs, big("huge", 100<<10))
	h.set(rs)
	h.subscribe("MeshTimeout")
	got := map[string]bool{}
	responses := 0
	for len(got) < len(rs) {
		r := h.recv()
		responses++
		g.Expect(proto.Size(r) <= limit || len(r.Resources) == 1).To(BeTrue(), "response %d: %d bytes, %d resources", responses, proto.Size(r), len(r.Resources))
		for _, res := range r.Resources {
			g.Expect(got).NotTo(HaveKey(res.Name), "sent twice")
			got[res.Name] = true
		}
		select {
		case extra := <-h.in:
			t.Fatalf("a second response (%d resources) before the first was answered", len(extra.Resources))
		case <-time.After(50 * time.Millisecond):
		}
		h.ack(r)
	}
	g.Expect(responses).To(BeNumerically(">=", 6), "17 x 20 KiB and one of 100 KiB under 64 KiB")

	h.set(nil)
	removed := map[string]bool{}
	for len(removed) < len(rs) {
		r := h.recv()
		for _, n := range r.RemovedResources {
			removed[n] = true
		}
		h.ack(r)
	}
}

// A stream the server closes ends at once with the server's status, while it waits for the zone's
// next request: replaced by a newer stream of its zone (Aborted), or the control plane stopping
// (Unavailable). The stream's one goroutine waits in Recv; grpc-go's server stream ends it.
func TestAClosedStreamEndsWithItsStatus(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, []string{"MeshTimeout"})
	h.set([]resource.Resource{policy("MeshTimeout", "default", "p", `{}`)})
	h.subscribe("MeshTimeout")
	h.ack(h.recv())

	h2 := h.reconnect(t)
	h2.subscribe("MeshTimeout")
	var err error
	g.Eventually(h.ended, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.Aborted), "%v", err)
	g.Expect(err.Error()).To(ContainSubstring(`this stream of node "zone-1" was replaced`))

	h2.ack(h2.recv())
	h.cache.Close()
	g.Eventually(h2.ended, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable), "%v", err)
	g.Expect(err.Error()).To(ContainSubstring("the control plane is stopping"))
}

// A stream may subscribe to only so many names the global does not hold: beyond the limit its
// request is refused with ResourceExhausted and counted, and nothing of it is kept. Before, 6
// million made-up names grew the global's heap to 831 MB.
func TestNamesTheGlobalDoesNotHoldAreBoundedPerStream(t *testing.T) {
	g := NewWithT(t)
	var refusals []event.Refusal
	var mu sync.Mutex
	h := newHarness(t, []string{"MeshTimeout"}, func(h *harness) *engine.Tracker {
		tr := engine.NewTracker(h.cache, h.zones.Observer(), event.Observer{Refused: func(r event.Refusal) {
			mu.Lock()
			refusals = append(refusals, r)
			mu.Unlock()
		}})
		tr.SetLimits(engine.Limits{MaxUnknownNames: 3})
		return tr
	})
	h.set([]resource.Resource{policy("MeshTimeout", "default", "held", `{}`)})
	send := func(names ...string) {
		g.Expect(h.stream.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "zone-1"}, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: names})).To(Succeed())
	}
	send("default/held", "made-up-1", "made-up-2", "made-up-2") // one held, two not (one twice)
	g.Expect(h.recv().Resources).To(HaveLen(1))
	send("made-up-3")
	send("made-up-4", "made-up-5")
	var err error
	g.Eventually(h.ended, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
	g.Expect(err.Error()).To(ContainSubstring("more than 3 names the global does not hold"))
	mu.Lock()
	defer mu.Unlock()
	g.Expect(refusals).To(ConsistOf(HaveField("Reason", "limit")))
}

// A zone that stops reading holds up nobody's writes: a write's fan-out sends a stream's answer
// itself only while what the stream has not had answered stays well under grpc-go's write quota
// of a stream, so its send never waits for a zone that reads nothing. The stuck zone's
// connection has a fixed window (no BDP growth), so its server side stops writing at 64 KiB.
func TestAZoneThatStopsReadingHoldsUpNoWrite(t *testing.T) {
	g := NewWithT(t)
	kinds := []string{"MeshCircuitBreaker", "MeshFaultInjection", "MeshHealthCheck", "MeshRateLimit", "MeshRetry", "MeshTimeout"}
	h := newHarness(t, kinds)
	var rs []resource.Resource
	for _, k := range kinds {
		rs = append(rs, policy(k, "m", "p", `{}`))
	}
	h.set(rs)
	h.subscribe(kinds...)
	for range kinds {
		h.ack(h.recv())
	}

	// The stuck zone: takes its full sync, ACKs it, then reads nothing more.
	conn, err := grpc.NewClient(h.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	stuck, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for i, k := range kinds {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: k}
		if i == 0 {
			req.Node = &core.Node{Id: "zone-2"}
		}
		g.Expect(stuck.Send(req)).To(Succeed())
	}
	for range kinds {
		r, err := stuck.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(stuck.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce})).To(Succeed())
	}
	g.Eventually(func() int { return len(h.zones.Connected()) }).Should(Equal(2))

	// Writes of 40 KiB, a kind each, twice over: without the bound the fan-out's fifth send to
	// the stuck zone would wait for it for ever, and every later write with it.
	pad := strings.Repeat("x", 40<<10)
	for round := range 2 {
		for _, k := range kinds {
			s, err := h.b.Update([]resource.Resource{policy(k, "m", "p", fmt.Sprintf(`{"round":%d,"pad":%q}`, round, pad))}, nil)
			g.Expect(err).NotTo(HaveOccurred())
			done := make(chan struct{})
			go func() { h.cache.SetSnapshot(s); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the write to %s (round %d) waited for the zone that reads nothing", k, round)
			}
			r := h.recv()
			g.Expect(r.TypeUrl).To(Equal(k))
			h.ack(r)
		}
	}
}

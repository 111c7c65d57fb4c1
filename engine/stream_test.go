package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/host/resource"
)

// fakeStream is a delta stream without gRPC: the test sends the zone's requests and reads what
// the loop sends.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	reqs chan *discovery.DeltaDiscoveryRequest
	sent chan *discovery.DeltaDiscoveryResponse
	// onSend, when set, is called by Send first: an error fails the send.
	onSend func() error
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Send(r *discovery.DeltaDiscoveryResponse) error {
	if f.onSend != nil {
		if err := f.onSend(); err != nil {
			return err
		}
	}
	f.sent <- r
	return nil
}

func (f *fakeStream) Recv() (*discovery.DeltaDiscoveryRequest, error) {
	select {
	case r := <-f.reqs:
		return r, nil
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
}

// loopZone is one zone's stream served by serveDelta.
type loopZone struct {
	str    *fakeStream
	cancel context.CancelFunc
	done   chan error
}

func startLoopZone(c *Cache, tr *Tracker, id int64, zone string) *loopZone {
	return startLoopZoneOf(c, tr, id, zone, "*")
}

// startLoopZoneOf is startLoopZone, the zone subscribing to names.
func startLoopZoneOf(c *Cache, tr *Tracker, id int64, zone string, names ...string) *loopZone {
	ctx, cancel := context.WithCancelCause(context.Background())
	z := &loopZone{done: make(chan error, 1), cancel: func() { cancel(nil) }}
	z.str = &fakeStream{ctx: ctx, reqs: make(chan *discovery.DeltaDiscoveryRequest), sent: make(chan *discovery.DeltaDiscoveryResponse, 8)}
	sctx := context.WithValue(ctx, streamKey{}, &streamInfo{node: zone, close: cancel, loop: true})
	go func() { z.done <- serveDelta(sctx, id, z.str, c, tr) }()
	z.str.reqs <- &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: zone}, TypeUrl: "MeshTimeout", ResourceNamesSubscribe: names}
	return z
}

func (z *loopZone) ack(r *discovery.DeltaDiscoveryResponse) {
	z.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResponseNonce: r.Nonce}
}

// policyAt is kind's policy name in mesh m at generation, its spec padded with pad bytes.
func policyAt(kind, name string, generation int64, pad int) resource.Resource {
	spec := fmt.Sprintf(`{"gen":%d,"pad":%q}`, generation, strings.Repeat("x", pad))
	return resource.Resource{Kind: kind, Mesh: "m", Name: name, Spec: json.RawMessage(spec), Generation: generation}
}

// A stream of kds's own loop is one goroutine, the RPC's, once it has sent its full sync and is
// waiting for the zone: nothing else of it is left running (go-control-plane's has two).
func TestAStreamIsOneGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		var b testSnapshots
		snap, err := b.Build([]resource.Resource{policyAt("MeshTimeout", "p", 1, 10)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(snap)
		const n = 20
		var zones []*loopZone
		for i := range n {
			zones = append(zones, startLoopZone(c, tr, int64(i+1), fmt.Sprintf("z%d", i)))
		}
		defer func() {
			for _, z := range zones {
				z.cancel()
				<-z.done
			}
		}()
		synctest.Wait()
		for _, z := range zones {
			g.Expect(z.str.sent).To(HaveLen(1), "the full sync")
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		streams := 0
		for _, gr := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(gr, "engine.serveDelta") || strings.Contains(gr, "engine.(*deltaStream)") {
				streams++
			}
		}
		g.Expect(streams).To(Equal(n), "goroutines of the streams' loops")
	})
}

// A zone's first sync of a kind it subscribes to whole is the snapshot's one list of the kind's
// entries, shared by every such zone, not a copy a zone; a zone that subscribes to some names
// gets those; a kind over the message limit is split; each ACK counts every entry it carried.
func TestAFirstSyncOfAWholeKindIsTheSnapshotsList(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		var b testSnapshots
		var rs []resource.Resource
		for i := range 5 {
			rs = append(rs, policyAt("MeshTimeout", fmt.Sprintf("p%d", i), 1, 10))
		}
		snap, err := b.Build(rs)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(snap)
		all, some := snap.order("MeshTimeout"), []string{snap.Names("MeshTimeout")[1], snap.Names("MeshTimeout")[3]}

		zones := []*loopZone{startLoopZone(c, tr, 1, "z1"), startLoopZone(c, tr, 2, "z2"),
			startLoopZoneOf(c, tr, 3, "z3", some...)}
		defer func() {
			for _, z := range zones {
				z.cancel()
				<-z.done
			}
		}()
		synctest.Wait()
		for i, z := range zones {
			g.Expect(z.str.sent).To(HaveLen(1), "zone %d", i+1)
			r := <-z.str.sent
			var names []string
			for _, res := range r.Resources {
				names = append(names, res.Name)
			}
			if i < 2 {
				g.Expect(all.isAll(r.Resources)).To(BeTrue(), "zone %d: the snapshot's list", i+1)
				g.Expect(names).To(Equal(snap.Names("MeshTimeout")))
			} else {
				g.Expect(all.isAll(r.Resources)).To(BeFalse())
				g.Expect(names).To(Equal(some))
			}
			z.ack(r)
		}
		synctest.Wait()
		for i, want := range []int{5, 5, 2} {
			s := c.Session(int64(i + 1))
			g.Expect(s.InFlight()).To(BeZero())
			g.Expect(s.Insight()[0].Known).To(Equal(want), "zone %d", i+1)
		}

		// Over the limit, the kind goes in parts, none of them the snapshot's list.
		tr.SetLimits(Limits{MaxMessage: all.size - 1})
		z := startLoopZone(c, tr, 4, "z4")
		zones = append(zones, z)
		synctest.Wait()
		r := <-z.str.sent
		g.Expect(all.isAll(r.Resources)).To(BeFalse())
		g.Expect(r.Resources).To(HaveLen(4))
		z.ack(r)
		synctest.Wait()
		g.Expect((<-z.str.sent).Resources).To(HaveLen(1))
	})
}

// The stream loop sends a session's responses itself, a few streams at a time when the budget is
// short: a response waits for room until another zone answers, or the response timeout closes the
// stream of a zone that does not;
// a request that replaces the watch of a waiting response takes it back (its names are sent in
// the next); and a closed stream gives its room back.
func TestTheStreamLoopSendsWhenTheBudgetHasRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		tr.SetLimits(Limits{MaxInFlightBytes: 1}) // one response at a time
		var b testSnapshots
		s, err := b.Build([]resource.Resource{{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{}`), Generation: 1}})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)

		zones := []*loopZone{startLoopZone(c, tr, 1, "z1"), startLoopZone(c, tr, 2, "z2"), startLoopZone(c, tr, 3, "z3")}
		synctest.Wait()
		var first, waiting []*loopZone
		for _, z := range zones {
			if len(z.str.sent) == 1 {
				first = append(first, z)
			} else {
				waiting = append(waiting, z)
			}
		}
		g.Expect(first).To(HaveLen(1), "one response fits")

		// A waiting zone asks again: its pending response is taken back, and answered anew.
		again := waiting[0]
		again.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout"}
		synctest.Wait()
		g.Expect(again.str.sent).To(BeEmpty(), "still no room")

		first[0].ack(<-first[0].str.sent)
		synctest.Wait()
		var second *loopZone
		for _, z := range waiting {
			if len(z.str.sent) == 1 {
				second = z
			}
		}
		g.Expect(second).NotTo(BeNil(), "the ACK made room for the next zone")
		last := waiting[0]
		if last == second {
			last = waiting[1]
		}
		g.Expect(last.str.sent).To(BeEmpty())

		// The second zone never answers: the last waits until the response timeout closes the
		// second's stream, no longer.
		r := <-second.str.sent
		g.Expect(r.Resources).To(HaveLen(1))
		time.Sleep(DefaultLimits().ResponseTimeout - time.Nanosecond)
		synctest.Wait()
		g.Expect(last.str.sent).To(BeEmpty())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		g.Expect(<-second.done).To(Succeed(), "closed with its status, which the zone is told")
		g.Expect(status.Code(context.Cause(second.str.ctx))).To(Equal(codes.DeadlineExceeded))
		synctest.Wait()
		g.Expect(last.str.sent).To(HaveLen(1))
		r = <-last.str.sent
		g.Expect(r.Resources).To(HaveLen(1), "what was taken back is in the answer")
		g.Expect(r.Resources[0].Name).To(Equal(s.Names("MeshTimeout")[0]))

		// Closed streams end their loops and give their room back.
		for _, z := range zones {
			if z != second {
				z.cancel()
				g.Expect(<-z.done).To(Succeed())
			}
		}
		g.Expect(c.budget.inUse()).To(BeZero())
	})
}

// A cache closing under open streams ends each stream loop through its stream's context, whose
// cause (codes.Unavailable) is what the zone is told; a stream that ends on its own is not given
// that cause.
func TestACacheClosingEndsTheStreamLoops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		tr := NewTracker(c)
		var b testSnapshots
		s, err := b.Build([]resource.Resource{{Kind: "MeshTimeout", Mesh: "m", Name: "a", Spec: json.RawMessage(`{}`), Generation: 1}})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)

		ended := startLoopZone(c, tr, 1, "z1")
		open := startLoopZone(c, tr, 2, "z2")
		synctest.Wait()
		ended.cancel() // its RPC ends
		g.Expect(<-ended.done).To(Succeed())
		g.Expect(context.Cause(ended.str.ctx)).To(MatchError(context.Canceled), "not the cache's cause")

		c.Close()
		g.Expect(<-open.done).To(Succeed(), "the loop ends")
		g.Expect(status.Code(context.Cause(open.str.ctx))).To(Equal(codes.Unavailable), "the zone is told why")
	})
}

// A write is one message for every stream of kds's own loop that is answered exactly the write's
// change: the same response, nonce included, encoded once. A stream that already has it in flight
// when it is answered the same again is sent a response of its own, numbered as the stream's;
// each stream's ACK or NACK of the shared one is its own.
func TestAWriteIsOneMessageForEveryStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		var b testSnapshots
		s, err := b.Build([]resource.Resource{policyAt("MeshTimeout", "a", 1, 0), policyAt("MeshTimeout", "b", 1, 0)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)
		zones := []*loopZone{startLoopZone(c, tr, 1, "z1"), startLoopZone(c, tr, 2, "z2"), startLoopZone(c, tr, 3, "z3")}
		synctest.Wait()
		for _, z := range zones {
			r := <-z.str.sent
			g.Expect(r.Resources).To(HaveLen(2))
			g.Expect(r.Nonce).To(Equal("1"), "a stream's own numbering")
			z.ack(r)
		}
		synctest.Wait()

		s2, err := b.Update([]resource.Resource{policyAt("MeshTimeout", "a", 2, 0)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s2)
		synctest.Wait()
		var got []*discovery.DeltaDiscoveryResponse
		for _, z := range zones {
			g.Expect(z.str.sent).To(HaveLen(1))
			got = append(got, <-z.str.sent)
		}
		shared := got[0]
		g.Expect(got[1]).To(BeIdenticalTo(shared))
		g.Expect(got[2]).To(BeIdenticalTo(shared))
		a := s2.Type("MeshTimeout")[s2.Names("MeshTimeout")[0]]
		g.Expect(shared.Resources).To(Equal([]*discovery.Resource{a.Wire}))
		g.Expect(shared.RemovedResources).To(BeEmpty())
		g.Expect(shared.Nonce).To(Equal(shared.SystemVersionInfo+".0"), "the snapshot's and the kind's")

		// Its encoding is made once, and decodes to the response.
		data, err := newResponseCodec(c).Marshal(shared)
		g.Expect(err).NotTo(HaveOccurred())
		again, err := newResponseCodec(c).Marshal(shared)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(unsafe.SliceData(again)).To(Equal(unsafe.SliceData(data)), "one encoding, every stream's")
		decoded := &discovery.DeltaDiscoveryResponse{}
		g.Expect(proto.Unmarshal(data.Materialize(), decoded)).To(Succeed())
		g.Expect(proto.Equal(decoded, shared)).To(BeTrue(), "decoded: %v", decoded)

		// z1 asks for the kind again while the shared response is in flight: the same answer
		// comes with a nonce of its own.
		zones[0].str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{a.Name}}
		synctest.Wait()
		g.Expect(zones[0].str.sent).To(HaveLen(1))
		own := <-zones[0].str.sent
		g.Expect(own).NotTo(BeIdenticalTo(shared))
		g.Expect(own.Nonce).To(Equal("2"))
		g.Expect(own.Resources).To(Equal([]*discovery.Resource{a.Wire}))

		// z2 ACKs the shared response, z3 refuses it: each stream's answer is its own.
		zones[1].ack(shared)
		zones[2].str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResponseNonce: shared.Nonce, ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}}
		synctest.Wait()
		v, ok := c.Session(2).AckedVersion("MeshTimeout", a.Name)
		g.Expect(ok).To(BeTrue())
		g.Expect(v).To(Equal(a.Version))
		v, _ = c.Session(3).AckedVersion("MeshTimeout", a.Name)
		g.Expect(v).NotTo(Equal(a.Version), "z3 refused it")
		g.Expect(c.Session(2).InFlight()).To(BeZero())
		g.Expect(c.Session(3).InFlight()).To(BeZero())
		g.Expect(c.Session(1).InFlight()).To(Equal(2), "the shared response and its own")

		// A removal is shared as well, under the next snapshot's nonce.
		s3, err := b.Update(nil, []resource.Key{{Kind: "MeshTimeout", Mesh: "m", Name: "b"}})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s3)
		synctest.Wait()
		g.Expect(zones[0].str.sent).To(BeEmpty(), "z1 has not asked since")
		removal := <-zones[1].str.sent
		g.Expect(<-zones[2].str.sent).To(BeIdenticalTo(removal))
		g.Expect(removal.Resources).To(BeEmpty())
		g.Expect(removal.RemovedResources).To(ConsistOf(HaveSuffix("b")))
		g.Expect(removal.Nonce).To(Equal(removal.SystemVersionInfo + ".0"))
		g.Expect(removal.Nonce).NotTo(Equal(shared.Nonce))

		for _, z := range zones {
			z.cancel()
			g.Expect(<-z.done).To(Succeed())
		}
	})
}

// A zone's ACK opens its kind's watch anew, and the new watch is the old one made afresh (no
// allocation a stream a write). A watch whose response is still in flight is not reused: a
// request while it is (a re-request) gets a new watch, and the zone's later ACK of that response
// still finds it.
func TestAnACKReusesTheKindsWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		var b testSnapshots
		s, err := b.Build([]resource.Resource{policyAt("MeshTimeout", "a", 1, 0)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)
		z := startLoopZone(c, tr, 1, "z1")
		synctest.Wait()
		st := c.Session(1)
		watch := func() *watch {
			st.mu.Lock()
			defer st.mu.Unlock()
			return st.kind("MeshTimeout").watch
		}

		sent := <-z.str.sent
		answered := watch()
		g.Expect(answered).NotTo(BeNil())
		g.Expect(answered.answered).To(BeTrue())
		z.ack(sent)
		synctest.Wait()
		w := watch()
		g.Expect(w).To(BeIdenticalTo(answered), "the ACKed response's watch, reused")
		g.Expect(w.answered).To(BeFalse(), "made afresh")
		g.Expect(w.resp).To(BeNil())
		g.Expect(st.InFlight()).To(BeZero())

		// An update goes out; the zone asks again before it answers it.
		s2, err := b.Update([]resource.Resource{policyAt("MeshTimeout", "a", 2, 0)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s2)
		synctest.Wait()
		update := <-z.str.sent
		inFlight := watch()
		z.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshTimeout", ResourceNamesSubscribe: []string{"*"}}
		synctest.Wait()
		g.Expect(watch()).NotTo(BeIdenticalTo(inFlight), "its response is in flight: a new watch")
		g.Expect(st.InFlight()).To(Equal(1))
		z.ack(update)
		synctest.Wait()
		a := s2.Type("MeshTimeout")[s2.Names("MeshTimeout")[0]]
		v, ok := st.AckedVersion("MeshTimeout", a.Name)
		g.Expect(ok).To(BeTrue())
		g.Expect(v).To(Equal(a.Version), "the ACK found the response it answers")
		g.Expect(st.InFlight()).To(BeZero())

		z.cancel()
		g.Expect(<-z.done).To(Succeed())
	})
}

// A write's fan-out sends the answer of a stream in step itself, with no wake-up of the stream's
// loop. A stream whose unanswered responses reach sendNowLimit is left to its loop, whatever the
// zone does with them; and a send of the fan-out's that fails ends the stream with its error.
func TestAWriteToAStreamInStepIsSentByTheFanOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshRetry", "MeshTimeout"})
		defer c.Close()
		tr := NewTracker(c)
		var b testSnapshots
		s, err := b.Build([]resource.Resource{policyAt("MeshTimeout", "a", 1, 0), policyAt("MeshRetry", "r", 1, 0)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)
		z := startLoopZone(c, tr, 1, "z1")
		z.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: "MeshRetry", ResourceNamesSubscribe: []string{"*"}}
		synctest.Wait()
		for range 2 {
			r := <-z.str.sent
			z.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}
		}
		synctest.Wait()

		// Who sends: the fan-out runs inside SetSnapshot, the loop in serveDelta.
		var byFanOut []bool
		var fail error
		z.str.onSend = func() error {
			buf := make([]byte, 64<<10)
			byFanOut = append(byFanOut, strings.Contains(string(buf[:runtime.Stack(buf, false)]), "SetSnapshot"))
			return fail
		}
		write := func(rs ...resource.Resource) *discovery.DeltaDiscoveryResponse {
			s, err := b.Update(rs, nil)
			g.Expect(err).NotTo(HaveOccurred())
			c.SetSnapshot(s)
			synctest.Wait()
			g.Expect(z.str.sent).To(HaveLen(1), "sent so far by the fan-out: %v", byFanOut)
			return <-z.str.sent
		}
		ack := func(r *discovery.DeltaDiscoveryResponse) {
			z.str.reqs <- &discovery.DeltaDiscoveryRequest{TypeUrl: r.TypeUrl, ResponseNonce: r.Nonce}
			synctest.Wait()
		}

		ack(write(policyAt("MeshTimeout", "a", 2, 0)))
		g.Expect(byFanOut).To(Equal([]bool{true}), "in step: the fan-out sends it")

		big := write(policyAt("MeshRetry", "r", 2, 40<<10)) // nothing unanswered: sent by the fan-out
		g.Expect(c.Session(1).unanswered()).To(BeNumerically(">=", sendNowLimit))
		small := write(policyAt("MeshTimeout", "a", 3, 0))
		g.Expect(byFanOut).To(Equal([]bool{true, true, false}), "40 KiB unanswered: left to the loop")
		ack(big)
		ack(small)

		fail = status.Error(codes.Unavailable, "the connection is gone")
		s3, err := b.Update([]resource.Resource{policyAt("MeshTimeout", "a", 4, 0)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s3)
		synctest.Wait()
		g.Expect(byFanOut).To(HaveLen(4))
		g.Expect(byFanOut[3]).To(BeTrue())
		g.Expect(status.Code(<-z.done)).To(Equal(codes.Unavailable), "the loop ended the stream with the send's error")
		z.cancel() // the RPC ends with its handler: the request goroutine's Recv fails
	})
}

// testView lets a zone see everything, or nothing yet (none).
type testView struct {
	none bool
	seq  uint64
}

func (v testView) Visible(*Entry) bool    { return !v.none }
func (v testView) None() bool             { return v.none }
func (v testView) SeesAll(*Snapshot) bool { return !v.none }
func (v testView) Seq() uint64            { return v.seq }

// A write that reaches a stream whose zone may see nothing yet (its first owner check has not
// answered) is not lost: its names wait, dirty, for the view that lets the zone see them.
func TestAWriteBeforeTheZonesFirstViewWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		c := NewCache([]string{"MeshTimeout"})
		defer c.Close()
		c.UseViews(true)
		tr := NewTracker(c)
		z := startLoopZone(c, tr, 1, "z1")
		synctest.Wait()
		g.Expect(z.str.sent).To(BeEmpty(), "nothing to send: the snapshot is empty")

		var b testSnapshots
		s, err := b.Build([]resource.Resource{policyAt("MeshTimeout", "a", 1, 0)})
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s)
		s2, err := b.Update([]resource.Resource{policyAt("MeshTimeout", "b", 1, 0)}, nil)
		g.Expect(err).NotTo(HaveOccurred())
		c.SetSnapshot(s2) // a write while the zone's whole kind waits for its first view
		synctest.Wait()
		g.Expect(z.str.sent).To(BeEmpty(), "the zone may see nothing yet")

		c.Publish("z1", testView{seq: 1})
		c.Refresh("z1", map[string][]string{"MeshTimeout": {s2.Names("MeshTimeout")[0]}}) // a only: what the check answered for
		synctest.Wait()
		r := <-z.str.sent
		var names []string
		for _, res := range r.Resources {
			names = append(names, res.Name)
		}
		g.Expect(names).To(ConsistOf(s2.Names("MeshTimeout")), "a, and the write's b, which waited")

		z.cancel()
		g.Expect(<-z.done).To(Succeed())
	})
}

package zone

// Kuma's zones get stuck in three ways its users report (kumahq/kuma #16326, #18208, #13624):
// each is a test of kds-host's zone against a global that fails the same way. The global here is
// a test double of the KDS server (health and the delta ADS stream), so that it can misbehave.

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// fakeGlobal serves the delta ADS stream: stream n (from 0) runs behave(n); serve sends the
// Mesh "default" once the zone subscribes to Mesh, and reads until the stream ends.
type fakeGlobal struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	t      *testing.T
	behave func(n int, s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error

	mu      sync.Mutex
	streams int
}

func (f *fakeGlobal) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	f.mu.Lock()
	n := f.streams
	f.streams++
	f.mu.Unlock()
	return f.behave(n, s)
}

func (f *fakeGlobal) serve(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if req.GetTypeUrl() == resource.MeshKind && req.GetResponseNonce() == "" {
			if err := s.Send(&discovery.DeltaDiscoveryResponse{TypeUrl: resource.MeshKind, Nonce: "1", Resources: []*discovery.Resource{meshEntry(f.t, "default")}}); err != nil {
				return err
			}
		}
	}
}

// start serves f on addr (":0" for any port) until the test ends, and returns its address.
func (f *fakeGlobal) start(addr string) string {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		f.t.Fatal(err)
	}
	s := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(s, f)
	healthpb.RegisterHealthServer(s, health.NewServer()) // SERVING
	go s.Serve(ln)
	f.t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// runZone runs a zone against addr until the test ends, and returns it and its store.
func runZone(t *testing.T, addr string, tune func(*Config)) (*Client, store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), "", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Zone: "zone-1", GlobalAddress: "grpc://" + addr, Store: st, Registry: resource.Default(),
		BackoffMin: 20 * time.Millisecond, BackoffMax: 400 * time.Millisecond, DialTimeout: time.Second}
	if tune != nil {
		tune(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		st.Close()
	})
	return c, st
}

func holdsMesh(st store.Store) func() bool {
	return func() bool {
		_, err := st.Get(context.Background(), resource.Key{Kind: resource.MeshKind, Name: "default"})
		return err == nil
	}
}

// #16326: a global whose stream ends cleanly (an OK status, not an error) left Kuma's zone
// connected and never receiving. kds-host's zone takes any end of the stream as an end, and
// connects again.
func TestAZoneReconnectsWhenTheGlobalEndsItsStreamCleanly(t *testing.T) {
	g := NewWithT(t)
	f := &fakeGlobal{t: t}
	f.behave = func(n int, s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
		if n < 3 {
			if _, err := s.Recv(); err != nil {
				return err
			}
			return nil // the stream ends cleanly, without sending anything
		}
		return f.serve(s)
	}
	_, st := runZone(t, f.start("127.0.0.1:0"), nil)
	g.Eventually(holdsMesh(st), 10*time.Second).Should(BeTrue())
	f.mu.Lock()
	defer f.mu.Unlock()
	g.Expect(f.streams).To(Equal(4))
}

// #18208: a global refusing the zone for a while (Kuma's "already connected" after a restart)
// pinned Kuma's zone at its backoff cap. kds-host's zone backs off while refused, connects as soon
// as it is accepted, and after a healthy stream starts again from its shortest backoff.
func TestAZoneRefusedForAWhileConnectsOnceAccepted(t *testing.T) {
	g := NewWithT(t)
	f := &fakeGlobal{t: t}
	var accepted time.Time
	var mu sync.Mutex
	f.behave = func(n int, s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
		if n < 8 {
			return status.Error(codes.AlreadyExists, "zone-1 is already connected to this global")
		}
		mu.Lock()
		if accepted.IsZero() {
			accepted = time.Now()
		}
		mu.Unlock()
		return f.serve(s)
	}
	c, st := runZone(t, f.start("127.0.0.1:0"), nil)
	g.Eventually(holdsMesh(st), 20*time.Second).Should(BeTrue())
	g.Expect(c.Stats().Connected).To(BeTrue())
	f.mu.Lock()
	defer f.mu.Unlock()
	g.Expect(f.streams).To(Equal(9), "one stream once accepted")
}

// #13624: a global that stops answering without closing the connection (frozen, or the network
// dropping everything) left Kuma's zone waiting until restarted. kds-host's zone notices within
// its probe's interval and timeout, and connects again.
func TestAZoneNoticesAGlobalThatStopsAnsweringAndReconnects(t *testing.T) {
	g := NewWithT(t)
	f := &fakeGlobal{t: t}
	f.behave = func(_ int, s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
		return f.serve(s)
	}
	p := newFreezer(t, f.start("127.0.0.1:0"))
	c, st := runZone(t, p.addr, func(cfg *Config) { cfg.ProbeInterval, cfg.ProbeTimeout = 200*time.Millisecond, 300*time.Millisecond })
	g.Eventually(holdsMesh(st), 10*time.Second).Should(BeTrue())
	g.Expect(c.Stats().Sessions).To(Equal(1))

	p.freeze() // every byte either way is held: nothing closes
	g.Eventually(func() bool { return c.Stats().Connected }, 5*time.Second).Should(BeFalse(), "noticed within the probe's interval and timeout")
	g.Expect(c.Stats().LastError).To(ContainSubstring("health check"))
	p.thaw()
	g.Eventually(func() bool { return c.Stats().Connected }, 10*time.Second).Should(BeTrue(), "connected again")
	g.Expect(c.Stats().Sessions).To(BeNumerically(">=", 2))
}

// freezer is a TCP proxy that can stop forwarding without closing anything.
type freezer struct {
	addr   string
	mu     sync.Mutex
	frozen bool
	thawed chan struct{}
}

func newFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezer{addr: ln.Addr().String(), thawed: make(chan struct{})}
	close(p.thawed)
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		p.thaw()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			cmu.Lock()
			conns = append(conns, in, out)
			cmu.Unlock()
			go p.pipe(in, out)
			go p.pipe(out, in)
		}
	}()
	return p
}

func (p *freezer) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		p.mu.Lock()
		thawed := p.thawed
		p.mu.Unlock()
		<-thawed // frozen: hold the bytes
		if n > 0 {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				to.Close()
			}
			return
		}
	}
}

func (p *freezer) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen {
		p.frozen, p.thawed = true, make(chan struct{})
	}
}

func (p *freezer) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		p.frozen = false
		close(p.thawed)
	}
}

// A global that ends the stream while the zone answers its last response: the zone's send fails
// with io.EOF (grpc-go's sign that the server closed the stream), and the reason the zone keeps
// is the global's status, which its receiver reads, not "EOF".
func TestAZoneKeepsTheGlobalsReasonWhenItsAnswerFindsTheStreamEnded(t *testing.T) {
	g := NewWithT(t)
	f := &fakeGlobal{t: t}
	f.behave = func(n int, s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
		if n > 0 {
			return f.serve(s)
		}
		for {
			req, err := s.Recv()
			if err != nil {
				return err
			}
			if req.GetTypeUrl() == resource.MeshKind {
				if err := s.Send(&discovery.DeltaDiscoveryResponse{TypeUrl: resource.MeshKind, Nonce: "1", Resources: []*discovery.Resource{meshEntry(t, "default")}}); err != nil {
					return err
				}
				// Ended before the zone's ACK can arrive: its send finds the stream closed.
				return status.Error(codes.Aborted, `this stream of zone "zone-1" was replaced by a newer one`)
			}
		}
	}
	c, st := runZone(t, f.start("127.0.0.1:0"), nil)
	g.Eventually(holdsMesh(st), 10*time.Second).Should(BeTrue())
	g.Eventually(func() string { return c.Stats().LastError }, 10*time.Second).Should(ContainSubstring("replaced by a newer one"))
	g.Expect(c.Stats().LastError).NotTo(ContainSubstring("EOF"))
}

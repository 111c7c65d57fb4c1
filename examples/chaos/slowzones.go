package main

// Slow zones: extra zones, SlowZones on each replica, each a real delta ADS stream with its own zone token, that subscribe
// to every kind (the large one first) with the smallest HTTP/2 windows and then stop reading,
// so that what the global sends them stays in flight. They never read, so they are not part of
// the lost and duplicated checks.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/resource"
)

const (
	// bigKind is the kind of the large resources; bigName names them (big-01, ...).
	bigKind = "MeshTrafficPermission"
	bigName = "big-%02d"
	// bigEach is the size of one large resource, under the API's 4 MiB a resource.
	bigEach = 3 << 20
	// slowWindow is HTTP/2's smallest window, the slow zones' stream and connection windows.
	slowWindow = 64 << 10
	// slowDrain bounds how long a leaving slow zone reads what is buffered for it, to learn
	// whether the global had ended its stream.
	slowDrain = 3 * time.Second
)

// slowZone is one slow zone: its name, the replica it connects to and its token.
type slowZone struct {
	name    string
	replica int
	token   string
}

// slowStats counts the slow zones and how their streams ended.
type slowStats struct {
	started, failed int
	ended           map[string]int    // by the gRPC code the global ended the stream with
	reasons         map[string]string // a message for each code, the first seen
	open            int               // still open when the slow zone left
}

// prepareSlowZones mints the slow zones' tokens (SlowZones a replica) and writes the large
// resources they will hold in flight, then waits until every zone holds them.
func (s *soak) prepareSlowZones() error {
	for r := range replicas {
		for i := range s.cfg.SlowZones {
			name := fmt.Sprintf("slow-r%d-%d", r+1, i+1)
			tok, err := s.mintZoneToken(name)
			if err != nil {
				return err
			}
			s.slowZoneList = append(s.slowZoneList, slowZone{name: name, replica: r, token: tok})
		}
	}
	began := time.Now()
	n := max(1, (s.cfg.BigBytes+bigEach-1)/bigEach)
	plural := resource.Plural(bigKind)
	for i := range n {
		name := fmt.Sprintf(bigName, i+1)
		if err := s.put(s.api(i%replicas), "/meshes/default/"+plural+"/"+name, bigDoc(name, min(bigEach, s.cfg.BigBytes))); err != nil {
			return fmt.Errorf("write the large resources: %w", err)
		}
	}
	last := "/meshes/default/" + plural + "/" + fmt.Sprintf(bigName, n)
	deadline := time.Now().Add(2 * time.Minute)
	for j := range s.zones {
		for {
			if o, _ := s.call(http.MethodGet, s.zoneAPI(j), last, ""); o == applied {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s has not got the large resources within 2m", s.zones[j].name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	s.log("setup: %d large %ss written and held by every zone in %s", n, bigKind, time.Since(began).Round(time.Millisecond))
	return nil
}

// bigDoc is a MeshTrafficPermission of about size bytes: from items of one long service name each.
func bigDoc(name string, size int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"type":%q,"mesh":"default","name":%q,"spec":{"targetRef":{"kind":"Mesh"},"from":[`, bigKind, name)
	pad := strings.Repeat("x", 4000) // few items: the API's cost of a resource grows with its items
	for i := 0; b.Len() < size-200; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"targetRef":{"kind":"MeshService","name":"svc-%06d-%s"},"default":{"action":"Allow"}}`, i, pad)
	}
	b.WriteString(`]}}`)
	return b.String()
}

// slowZones is the fault: the slow zones connect (SlowZones to each replica), stop reading for
// hold, and leave.
func (s *soak) slowZones(hold time.Duration) {
	var (
		mu      sync.Mutex
		streams []*slowStream
		wg      sync.WaitGroup
	)
	for _, sz := range s.slowZoneList {
		wg.Go(func() {
			z, err := openSlowZone(sz.name, s.kdsAddrs[sz.replica], sz.token)
			if err != nil {
				s.log("slow zone: %v", err)
				s.mu.Lock()
				s.slow.failed++
				s.mu.Unlock()
				return
			}
			mu.Lock()
			streams = append(streams, z)
			mu.Unlock()
		})
	}
	wg.Wait()
	s.mu.Lock()
	s.slow.started += len(streams)
	s.mu.Unlock()
	time.Sleep(hold)
	for _, z := range streams {
		wg.Go(func() {
			code, msg, open := z.leave()
			if !open {
				s.log("slow zone %s: ended by the global: %s: %s", z.name, code, msg)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if open {
				s.slow.open++
				return
			}
			s.slow.ended[code]++
			if _, ok := s.slow.reasons[code]; !ok {
				s.slow.reasons[code] = msg
			}
		})
	}
	wg.Wait()
}

// slowStream is one slow zone's stream.
type slowStream struct {
	name   string
	conn   *grpc.ClientConn
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	ctx    context.Context
	cancel context.CancelFunc
}

// openSlowZone connects to the global at addr as zone name, with the smallest windows, and
// subscribes to every kind, the large one first; it reads nothing.
func openSlowZone(name, addr, token string) (*slowStream, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStaticStreamWindowSize(slowWindow), grpc.WithStaticConnWindowSize(slowWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{})
	hcancel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: reach %s: %w", name, addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	z := &slowStream{name: name, conn: conn, ctx: ctx, cancel: cancel}
	// The subscription is a few small requests; should the global not take them within 5 s,
	// the stream goes.
	setup := time.AfterFunc(5*time.Second, cancel)
	defer setup.Stop()
	z.stream, err = discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(
		metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token))
	if err != nil {
		z.close()
		return nil, fmt.Errorf("%s: open a stream to %s: %w", name, addr, err)
	}
	kinds := []string{bigKind}
	for _, k := range resource.Default().Names() {
		if k != bigKind {
			kinds = append(kinds, k)
		}
	}
	node := &core.Node{Id: name}
	for _, k := range kinds {
		if err := z.stream.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: k}); err != nil {
			z.close()
			return nil, fmt.Errorf("%s: subscribe to %s: %w", name, k, err)
		}
		node = nil // in the first request only
	}
	if !setup.Stop() {
		z.close()
		return nil, fmt.Errorf("%s: the subscription took more than 5s", name)
	}
	return z, nil
}

// leave reads what is buffered for the stream, for slowDrain at most, to learn how it ended:
// the code and message the global ended it with, or open when it was still open; then the slow
// zone goes.
func (z *slowStream) leave() (code, msg string, open bool) {
	defer z.close()
	drain := time.AfterFunc(slowDrain, z.cancel)
	defer drain.Stop()
	for {
		_, err := z.stream.Recv()
		if err == nil {
			continue
		}
		if z.ctx.Err() != nil {
			return "", "", true // ended by the drain's deadline: the global had not ended it
		}
		st := status.Convert(err)
		return st.Code().String(), st.Message(), false
	}
}

func (z *slowStream) close() {
	z.cancel()
	z.conn.Close()
}

package main

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/kds-host/kds-host/engine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// floor is the least a delta ADS server on grpc-go can do for the bench's fleet, the floor under
// any server's figures on this machine: no cache, no versions, no state per stream but its
// sender lock. A subscription is answered with every resource of its kind; an update sends the
// target's new version to every open stream; ACKs are read and dropped. Each response is encoded
// once (grpc.PreparedMsg) and shared by every stream that sends it, nonce included, so what a
// stream costs is grpc-go's: a send, a receive, their frames and syscalls.
type floor struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer

	full map[string]*discovery.DeltaDiscoveryResponse // per type URL: every resource of the kind

	mu       sync.Mutex
	streams  map[*floorStream]struct{}
	order    []*floorStream               // streams by connection, kept until one opens or closes
	prepared map[string]*grpc.PreparedMsg // per type URL: full, encoded by the first stream that asked
}

type floorStream struct {
	mu   sync.Mutex // one SendMsg at a time: the stream's receive loop and an update's fan-out
	s    discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	conn string // the peer's address: the same for the streams of one connection
}

func (fs *floorStream) send(m any) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.s.SendMsg(m)
}

func newFloor(entries []*engine.Entry) *floor {
	f := &floor{full: map[string]*discovery.DeltaDiscoveryResponse{}, streams: map[*floorStream]struct{}{},
		prepared: map[string]*grpc.PreparedMsg{}}
	for _, e := range entries {
		r := f.full[e.TypeURL]
		if r == nil {
			r = &discovery.DeltaDiscoveryResponse{TypeUrl: e.TypeURL, Nonce: "full"}
			f.full[e.TypeURL] = r
		}
		r.Resources = append(r.Resources, e.Wire)
	}
	return f
}

func (f *floor) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	fs := &floorStream{s: s}
	if p, ok := peer.FromContext(s.Context()); ok && p.Addr != nil {
		fs.conn = p.Addr.String()
	}
	f.mu.Lock()
	f.streams[fs] = struct{}{}
	f.order = nil
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.streams, fs)
		f.order = nil
		f.mu.Unlock()
	}()
	for {
		req, err := s.Recv()
		if err != nil {
			return err
		}
		if req.GetResponseNonce() != "" {
			continue // an ACK
		}
		m, err := f.fullMsg(s, req.GetTypeUrl())
		if err != nil {
			return err
		}
		if err := fs.send(m); err != nil {
			return err
		}
	}
}

// fullMsg is the full sync's message for a kind, encoded once, by the first stream that asks for
// it: a PreparedMsg is bound to its stream's codec and compressor, and every stream of
// grpc.NewServer's has the same codec and no compressor.
func (f *floor) fullMsg(s grpc.ServerStream, typeURL string) (*grpc.PreparedMsg, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.prepared[typeURL]; m != nil {
		return m, nil
	}
	full, ok := f.full[typeURL]
	if !ok {
		full = &discovery.DeltaDiscoveryResponse{TypeUrl: typeURL, Nonce: "full"}
	}
	m := &grpc.PreparedMsg{}
	if err := m.Encode(s, full); err != nil {
		return nil, err
	}
	f.prepared[typeURL] = m
	return m, nil
}

// update sends e to every open stream, from as many goroutines as there are cores: the message
// is encoded once and its bytes shared, and the streams of a connection are sent back to back
// (grpc-go's writer flushes them together), as kds-host's fan-out does.
func (f *floor) update(ctx context.Context, seq int, e *engine.Entry) error {
	resp := &discovery.DeltaDiscoveryResponse{TypeUrl: e.TypeURL, Nonce: fmt.Sprintf("u%d", seq), Resources: []*discovery.Resource{e.Wire}}
	f.mu.Lock()
	if f.order == nil {
		f.order = slices.SortedFunc(maps.Keys(f.streams), func(a, b *floorStream) int { return strings.Compare(a.conn, b.conn) })
	}
	streams := f.order
	f.mu.Unlock()
	if len(streams) == 0 {
		return nil
	}
	// One encoding: every stream of grpc.NewServer's has the same codec and no compressor.
	m := &grpc.PreparedMsg{}
	if err := m.Encode(streams[0].s, resp); err != nil {
		return err
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(streams); i += workers {
				if ctx.Err() != nil {
					return
				}
				if err := streams[i].send(m); err != nil && status.Code(err) != codes.Canceled {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

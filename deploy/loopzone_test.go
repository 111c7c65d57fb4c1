package deploy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/resource"
)

// loopingZone is a zone client that asks its global again and again for a name it holds, as a
// zone of a broken build would that loops on a cause it believes cleared: a real delta xDS
// client with a real zone token on the global's KDS port. It subscribes to every kind and
// answers every response (an ACK), so the global sees a connected zone in sync; while looping it
// sends a re-request every period. Its goroutines are owned: stop ends them.
type loopingZone struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	looping bool
	err     error
}

// startLoopingZone connects to global (plaintext) as zone with the token in tokenFile.
func startLoopingZone(global, zone, tokenFile string, period time.Duration) (*loopingZone, error) {
	tok, err := auth.ReadTokenFile(tokenFile)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(global, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok))
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	z := &loopingZone{cancel: cancel, done: make(chan struct{})}
	acks := make(chan *discovery.DeltaDiscoveryRequest, 64)
	var names sync.Map // type URL -> a name the global sent
	var wg sync.WaitGroup
	wg.Go(func() { // the receiver: every response is ACKed by the sender
		for {
			resp, err := stream.Recv()
			if err != nil {
				z.fail(err)
				cancel()
				return
			}
			for _, r := range resp.GetResources() {
				names.Store(resp.GetTypeUrl(), r.GetName())
			}
			select {
			case acks <- &discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}:
			case <-ctx.Done():
				return
			}
		}
	})
	wg.Go(func() { // the sender: the subscriptions, the ACKs, and the loop's re-requests
		node := &core.Node{Id: zone}
		for _, kind := range resource.Default().Names() {
			if err := stream.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: kind}); err != nil {
				z.fail(err)
				cancel()
				return
			}
			node = nil
		}
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			var req *discovery.DeltaDiscoveryRequest
			select {
			case <-ctx.Done():
				return
			case req = <-acks:
			case <-tick.C:
				if !z.isLooping() {
					continue
				}
				name, ok := names.Load(resource.MeshKind)
				if !ok {
					continue
				}
				req = &discovery.DeltaDiscoveryRequest{TypeUrl: resource.MeshKind, ResourceNamesSubscribe: []string{name.(string)}}
			}
			if err := stream.Send(req); err != nil {
				z.fail(err)
				cancel()
				return
			}
		}
	})
	go func() {
		wg.Wait()
		conn.Close()
		close(z.done)
	}()
	return z, nil
}

func (z *loopingZone) fail(err error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.err == nil {
		z.err = err
	}
}

func (z *loopingZone) isLooping() bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.looping
}

// loop starts or stops the re-requests; it fails once the stream has ended.
func (z *loopingZone) loop(on bool) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.err != nil {
		return fmt.Errorf("the looping zone's stream ended: %w", z.err)
	}
	z.looping = on
	return nil
}

// stop ends the stream and waits for its goroutines.
func (z *loopingZone) stop() error {
	z.cancel()
	<-z.done
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.err != nil && !errors.Is(z.err, context.Canceled) && status.Code(z.err) != codes.Canceled {
		return z.err
	}
	return nil
}

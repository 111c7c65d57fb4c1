package kds

// The delta stream loop: go-control-plane's delta server loop (pkg/server/delta/v3, v0.14), with
// what KDS needs of it and no more. It differs in three ways: it ends when the stream's own
// context does (the tracker closes a stream that a newer one of its zone replaced, and the loop
// must end without waiting for the zone's next request), it keeps no copy of what each
// subscription was sent (the session keeps what the zone holds), and its channels are sized to
// the cache's kinds. Callbacks and the cache are called exactly as that loop calls them.

import (
	"context"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deltaStream is one stream's state in the loop.
type deltaStream struct {
	id      int64
	str     discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	cache   *Cache
	tracker *Tracker
	nonce   int64
	watches map[string]*deltaWatch
	// responses is every watch's channel. The session's sender blocks on it at most until the
	// loop reads it or cancels the watch (the sender gives up a canceled watch's response), so
	// a small buffer is enough: it only spares the sender a wait.
	responses chan cache.DeltaResponse
}

type deltaWatch struct {
	cancel func()
	sub    stream.Subscription
}

// serveDelta serves one delta stream until ctx ends (the RPC ended, the tracker closed it, or the
// server stops), the zone stops sending, or a callback or send fails.
func serveDelta(ctx context.Context, id int64, str discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, c *Cache, t *Tracker) error {
	s := &deltaStream{id: id, str: str, cache: c, tracker: t,
		watches: map[string]*deltaWatch{}, responses: make(chan cache.DeltaResponse, 2)}
	node := &core.Node{}
	defer func() {
		for _, w := range s.watches {
			w.cancel()
		}
		t.OnDeltaStreamClosed(id, node)
	}()

	// The zone's requests, read on a goroutine of their own; it ends with the RPC (Recv fails
	// once the handler returned) or when the loop has ended.
	requests := make(chan *discovery.DeltaDiscoveryRequest)
	go func() {
		defer close(requests)
		for {
			req, err := str.Recv()
			if err != nil {
				return
			}
			select {
			case requests <- req:
			case <-ctx.Done():
				return
			}
		}
	}()

	if err := t.OnDeltaStreamOpen(ctx, id, ""); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case resp := <-s.responses:
			if err := s.send(resp); err != nil {
				return err
			}
		case req, more := <-requests:
			if !more {
				return nil // the zone closed its side, or the RPC ended
			}
			if err := s.sendQueued(); err != nil { // what was answered goes out before the request
				return err
			}
			if err := t.OnStreamDeltaRequest(id, req); err != nil {
				return err
			}
			// The node might come on the first request only: every request carries it on.
			if req.GetNode() != nil {
				node = req.GetNode()
			} else {
				req.Node = node
			}
			kind := req.GetTypeUrl()
			if kind == "" {
				return status.Errorf(codes.InvalidArgument, "type URL is required for ADS")
			}
			w := s.watches[kind]
			if w == nil {
				// The legacy wildcard: a first request that names nothing subscribes to all.
				w = &deltaWatch{sub: stream.NewDeltaSubscription(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe(), req.GetInitialResourceVersions(), true)}
				s.watches[kind] = w
			} else {
				w.cancel()
				w.sub.UpdateResourceSubscriptions(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
			}
			cancel, err := c.CreateDeltaWatch(req, w.sub, s.responses)
			if err != nil {
				return err
			}
			w.cancel = cancel
		}
	}
}

// sendQueued sends the responses the cache has answered already.
func (s *deltaStream) sendQueued() error {
	for {
		select {
		case resp := <-s.responses:
			if err := s.send(resp); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// send numbers a response with the stream's next nonce, tells the tracker, and sends it.
func (s *deltaStream) send(resp cache.DeltaResponse) error {
	r, err := resp.GetDeltaDiscoveryResponse()
	if err != nil {
		return err
	}
	s.nonce++
	r.Nonce = strconv.FormatInt(s.nonce, 10)
	s.tracker.OnStreamDeltaResponse(s.id, resp.GetDeltaRequest(), r)
	return s.str.Send(r)
}

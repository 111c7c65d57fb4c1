package guard

import (
	"context"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
)

// callbacks are New's: each stream callback checks the stream's bounds and feeds its node's
// snapshot (the Guard's), then calls the engine's and next's (server.Callbacks, the stack's
// composed with next); the REST callbacks are next's.
type callbacks struct {
	server.Callbacks
	passFetch
	g *Guard
}

func (c *callbacks) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	return c.passFetch.OnFetchRequest(ctx, req)
}

func (c *callbacks) OnFetchResponse(req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	c.passFetch.OnFetchResponse(req, resp)
}

// The engine numbers a SotW stream -id, a delta stream id.

func (c *callbacks) OnStreamOpen(ctx context.Context, id int64, typeURL string) error {
	c.g.opened(-id)
	return c.Callbacks.OnStreamOpen(ctx, id, typeURL)
}

func (c *callbacks) OnStreamClosed(id int64, node *core.Node) {
	c.Callbacks.OnStreamClosed(id, node)
	c.g.closed(-id)
}

// OnStreamRequest refuses a request past the stream's bounds (bounds.go) before the server
// stores any of it.
func (c *callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	followed, err := c.g.request(-id, request{node: req.GetNode(), typeURL: req.GetTypeUrl(), subscribe: req.GetResourceNames(), sotw: true})
	switch {
	case err != nil:
		return err
	case !followed && c.next != nil: // a stream the guard was not told of: next's alone
		return c.next.OnStreamRequest(id, req)
	case !followed:
		return nil
	}
	return c.Callbacks.OnStreamRequest(id, req)
}

func (c *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, typeURL string) error {
	c.g.opened(id)
	return c.Callbacks.OnDeltaStreamOpen(ctx, id, typeURL)
}

func (c *callbacks) OnDeltaStreamClosed(id int64, node *core.Node) {
	c.Callbacks.OnDeltaStreamClosed(id, node)
	c.g.closed(id)
}

// OnStreamDeltaRequest is OnStreamRequest for a delta stream.
func (c *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	followed, err := c.g.request(id, request{node: req.GetNode(), typeURL: req.GetTypeUrl(), subscribe: req.GetResourceNamesSubscribe(),
		unsubscribe: req.GetResourceNamesUnsubscribe(), initial: req.GetInitialResourceVersions()})
	switch {
	case err != nil:
		return err
	case !followed && c.next != nil:
		return c.next.OnStreamDeltaRequest(id, req)
	case !followed:
		return nil
	}
	return c.Callbacks.OnStreamDeltaRequest(id, req)
}

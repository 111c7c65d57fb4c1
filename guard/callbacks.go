package guard

import (
	"context"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
)

// Callbacks returns the server callbacks that let the guard follow each stream: pass them to
// server.NewServer. Each calls the guard's and then next's (may be nil), so the server's own
// callbacks keep working; an error from next ends the stream, as it would without the guard.
func (g *Guard) Callbacks(next server.Callbacks) server.Callbacks {
	return &callbacks{g: g, next: next}
}

type callbacks struct {
	g    *Guard
	next server.Callbacks
}

func (c *callbacks) OnStreamOpen(ctx context.Context, id int64, typeURL string) error {
	c.g.openStream(id, false)
	if c.next != nil {
		return c.next.OnStreamOpen(ctx, id, typeURL)
	}
	return nil
}

func (c *callbacks) OnStreamClosed(id int64, node *core.Node) {
	c.g.closeStream(id)
	if c.next != nil {
		c.next.OnStreamClosed(id, node)
	}
}

// OnStreamRequest refuses a request past the stream's bounds (bounds.go), else applies the
// answer it carries (an ACK or NACK of the last response of its type) and binds the request to
// its stream for CreateWatch. It returns at once.
func (c *callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	if s := c.g.session(id); s != nil {
		if err := s.admit(request{node: req.GetNode(), typeURL: req.GetTypeUrl(), subscribe: req.GetResourceNames(), sotw: true}); err != nil {
			return err
		}
		bind(c.g, c.g.requests, s, req.GetTypeUrl(), req)
		s.request(req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail(), false)
	}
	if c.next != nil {
		return c.next.OnStreamRequest(id, req)
	}
	return nil
}

// OnStreamResponse records what went out, with its nonce, to pair it with the client's answer.
func (c *callbacks) OnStreamResponse(ctx context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	if s := c.g.session(id); s != nil {
		s.sent(resp.GetTypeUrl(), resp.GetNonce(), func(f *flight) bool { return f.resp == resp })
	}
	if c.next != nil {
		c.next.OnStreamResponse(ctx, id, req, resp)
	}
}

func (c *callbacks) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	if c.next != nil {
		return c.next.OnFetchRequest(ctx, req)
	}
	return nil
}

func (c *callbacks) OnFetchResponse(req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	if c.next != nil {
		c.next.OnFetchResponse(req, resp)
	}
}

func (c *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, typeURL string) error {
	c.g.openStream(deltaID(id), true)
	if c.next != nil {
		return c.next.OnDeltaStreamOpen(ctx, id, typeURL)
	}
	return nil
}

func (c *callbacks) OnDeltaStreamClosed(id int64, node *core.Node) {
	c.g.closeStream(deltaID(id))
	if c.next != nil {
		c.next.OnDeltaStreamClosed(id, node)
	}
}

// OnStreamDeltaRequest is OnStreamRequest for a delta stream.
func (c *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	if s := c.g.session(deltaID(id)); s != nil {
		if err := s.admit(request{node: req.GetNode(), typeURL: req.GetTypeUrl(), subscribe: req.GetResourceNamesSubscribe(),
			unsubscribe: req.GetResourceNamesUnsubscribe(), initial: req.GetInitialResourceVersions()}); err != nil {
			return err
		}
		bind(c.g, c.g.deltaRequests, s, req.GetTypeUrl(), req)
		asks := len(req.GetResourceNamesSubscribe())+len(req.GetResourceNamesUnsubscribe()) > 0
		s.request(req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail(), asks)
	}
	if c.next != nil {
		return c.next.OnStreamDeltaRequest(id, req)
	}
	return nil
}

func (c *callbacks) OnStreamDeltaResponse(id int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	if s := c.g.session(deltaID(id)); s != nil {
		s.deltaSent(resp)
	}
	if c.next != nil {
		c.next.OnStreamDeltaResponse(id, req, resp)
	}
}

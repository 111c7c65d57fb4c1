package engine

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/anypb"
)

// testClient is one client stream driven as go-control-plane's servers drive the engine (the
// guard's way), without gRPC: each request through the tracker's callbacks, then the cache's
// watch of its type, the previous one canceled; and what a watch answers handed to the callbacks
// as sent, numbered. Use it inside synctest.Test: take waits for the stream's sender.
type testClient struct {
	t     *testing.T
	c     *Cache
	tr    *Tracker
	id    int64 // the server's stream id (the cache's session of a SotW stream is sotwID(id))
	sotw  bool
	node  string // sent with every request ("": none)
	nonce int

	subs    map[string]*stream.Subscription
	cancels map[string]func()
	dout    map[string]chan cache.DeltaResponse
	sout    map[string]chan cache.Response
}

// openClient opens stream id of node, of either protocol. It is closed when the test ends.
func openClient(t *testing.T, c *Cache, tr *Tracker, id int64, node string, sotw bool) *testClient {
	return openClientCtx(t, context.Background(), c, tr, id, node, sotw)
}

// openClientCtx is openClient with the stream's context (a streamInfo in it, for one).
func openClientCtx(t *testing.T, ctx context.Context, c *Cache, tr *Tracker, id int64, node string, sotw bool) *testClient {
	cl := &testClient{t: t, c: c, tr: tr, id: id, sotw: sotw, node: node, subs: map[string]*stream.Subscription{},
		cancels: map[string]func(){}, dout: map[string]chan cache.DeltaResponse{}, sout: map[string]chan cache.Response{}}
	var err error
	if sotw {
		err = tr.OnStreamOpen(ctx, id, "")
	} else {
		err = tr.OnDeltaStreamOpen(ctx, id, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.close)
	return cl
}

// session is the cache's session of the stream.
func (cl *testClient) session() *Session {
	if cl.sotw {
		return cl.c.Session(sotwID(cl.id))
	}
	return cl.c.Session(cl.id)
}

// close closes the stream as the server does: its watches canceled, then the callback.
func (cl *testClient) close() {
	for k, cancel := range cl.cancels {
		cancel()
		delete(cl.cancels, k)
	}
	if cl.sotw {
		cl.tr.OnStreamClosed(cl.id, nil)
	} else {
		cl.tr.OnDeltaStreamClosed(cl.id, nil)
	}
}

// ask is the client's request of typeURL for names (nil: every resource), answering nonce
// ("": none), and the server's watch after it unless the callbacks refuse it (their error).
func (cl *testClient) ask(typeURL string, names []string, nonce string) error {
	return cl.askHolding(typeURL, names, nonce, nil)
}

// askHolding is ask with what a delta client says it holds of the type on its first request
// (initial_resource_versions).
func (cl *testClient) askHolding(typeURL string, names []string, nonce string, initial map[string]string) error {
	var node *core.Node
	if cl.node != "" {
		node = &core.Node{Id: cl.node}
	}
	sub := cl.subs[typeURL]
	first := sub == nil
	if cl.sotw {
		req := &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names, ResponseNonce: nonce}
		if err := cl.tr.OnStreamRequest(cl.id, req); err != nil {
			return err
		}
		if first {
			s := stream.NewSotwSubscription(names, true)
			sub = &s
			cl.subs[typeURL], cl.sout[typeURL] = sub, make(chan cache.Response, 1)
		} else {
			sub.SetResourceSubscription(names)
		}
		cl.cancelWatch(typeURL)
		cancel, err := cl.c.CreateWatch(req, sub, cl.sout[typeURL])
		if err != nil {
			cl.t.Fatal(err)
		}
		cl.cancels[typeURL] = cancel
		return nil
	}
	req := &discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: typeURL, ResponseNonce: nonce}
	if first {
		req.ResourceNamesSubscribe, req.InitialResourceVersions = names, initial
	}
	if err := cl.tr.OnStreamDeltaRequest(cl.id, req); err != nil {
		return err
	}
	if first {
		s := stream.NewDeltaSubscription(names, nil, initial, true)
		sub = &s
		cl.subs[typeURL], cl.dout[typeURL] = sub, make(chan cache.DeltaResponse, 1)
	}
	cl.cancelWatch(typeURL)
	cancel, err := cl.c.CreateDeltaWatch(req, sub, cl.dout[typeURL])
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.cancels[typeURL] = cancel
	return nil
}

func (cl *testClient) cancelWatch(typeURL string) {
	if cancel := cl.cancels[typeURL]; cancel != nil {
		cancel()
		delete(cl.cancels, typeURL)
	}
}

// reply is a response the client got: its nonce, the names of the resources it carried (a SotW
// response's read from them), and the names it removed (delta only).
type reply struct {
	nonce   string
	names   []string
	removed []string
}

// take waits until nothing in the bubble can run, and returns the response of typeURL the
// stream's sender handed to the server, sent with the next nonce; nil when there is none.
func (cl *testClient) take(typeURL string) *reply {
	synctest.Wait()
	cl.nonce++
	r := &reply{nonce: strconv.Itoa(cl.nonce)}
	if cl.sotw {
		select {
		case resp := <-cl.sout[typeURL]:
			dr, err := resp.GetDiscoveryResponse()
			if err != nil {
				cl.t.Fatal(err)
			}
			dr.Nonce = r.nonce
			for _, a := range dr.GetResources() {
				r.names = append(r.names, anyName(cl.t, a))
			}
			cl.tr.OnStreamResponse(context.Background(), cl.id, resp.GetRequest(), dr)
			return r
		default:
			return nil
		}
	}
	select {
	case resp := <-cl.dout[typeURL]:
		dr, err := resp.GetDeltaDiscoveryResponse()
		if err != nil {
			cl.t.Fatal(err)
		}
		dr.Nonce = r.nonce
		for _, res := range dr.GetResources() {
			r.names = append(r.names, res.GetName())
		}
		r.removed = dr.GetRemovedResources()
		cl.tr.OnStreamDeltaResponse(cl.id, resp.GetDeltaRequest(), dr)
		return r
	default:
		return nil
	}
}

// ackAll takes the response of typeURL, if any, and ACKs it (asking for names again, as a SotW
// client does): it returns the response.
func (cl *testClient) ackAll(typeURL string, names []string) *reply {
	r := cl.take(typeURL)
	if r != nil {
		if err := cl.ask(typeURL, names, r.nonce); err != nil {
			cl.t.Fatal(err)
		}
	}
	return r
}

// anyName is the name of the resource a carries.
func anyName(t *testing.T, a *anypb.Any) string {
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	return cache.GetResourceName(m)
}

// expectSent expects r, a response taken, to carry names: nil, no response; empty, an empty one.
func expectSent(t testing.TB, r *reply, names []string, what ...any) {
	t.Helper()
	g := NewWithT(t)
	if names == nil {
		g.Expect(r).To(BeNil(), what...)
		return
	}
	g.Expect(r).NotTo(BeNil(), what...)
	g.Expect(r.names).To(HaveLen(len(names)), what...)
	if len(names) > 0 {
		g.Expect(r.names).To(Equal(names), what...)
	}
}

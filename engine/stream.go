package engine

// The delta stream loop: go-control-plane's delta server loop (pkg/server/delta/v3, v0.14), with
// what the engine needs of it and no more. It differs in five ways. It ends when the server
// closes the stream (the tracker closes a stream that a newer one of its node replaced) without
// waiting for the client's next request: the server writes the stream's status through grpc-go's
// server stream, which ends its Recv and Send (ads.go). It sends the session's answered responses
// itself, in their order, when the budget has room for them, instead of receiving them from a
// sender goroutine over a channel. It runs on one goroutine a stream, the RPC's own, which reads
// the client's requests, handles each under the stream's lock and then sends what it answered
// (go-control-plane's runs two: the RPC's, and one reading requests); what is answered between
// requests is sent by a write's fan-out itself when the stream is in step (sendNow), otherwise by
// a goroutine started for it (kick) or for the room it waits for (awaitRoom), which ends once it
// has sent. It keeps no copy of what each subscription was sent (the session keeps what the node
// holds). And its state grows with the types the client asks for, not with every type there is.
// Callbacks are called in the order that loop calls them, one at a time (the stream's lock), from
// whichever goroutine holds it.

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deltaStream is one stream's state in the loop. The RPC's goroutine, a write's fan-out
// (sendNow) and the goroutines started to send (kick, awaitRoom) change it under mu; whichever of
// them finds nobody draining the outbox sends what it holds, in order, with no lock held.
type deltaStream struct {
	id      int64
	str     discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	cache   *Cache
	tracker *Tracker
	st      *Session
	close   context.CancelCauseFunc // ends the stream with a status: its Recv and Send return

	// kicked: a send of the session's queue is due, and a goroutine is started for it or the
	// RPC's goroutine sends once the request it handles (handling) is done.
	kicked   atomic.Bool
	handling atomic.Bool

	// mu guards the fields below. It is held to change them only: never across Send, an
	// observer, or a wait.
	mu      sync.Mutex
	idle    sync.Cond // on mu: draining ended
	closed  bool      // the loop has ended: nothing is sent any more
	failed  error     // a send failed: the stream ends with it
	nonce   int64
	watches map[string]*deltaWatch

	// pending is the answered watch taken off the session's queue whose response waits for room
	// in the budget (cost bytes of it), queued there as wait, until the budget grants it;
	// awaitRoom waits for that.
	pending *watch
	cost    int64
	wait    *budgetWaiter

	// outbox is what was handed over and numbered, in order, not sent yet; draining: a goroutine
	// sends it (flush), and sends what is added meanwhile too.
	outbox   []outgoing
	head     int   // outbox[:head] is sent
	unsent   int64 // the cost of outbox[head:]
	draining bool
}

// outgoing is a response handed over to be sent, with its record in the session.
type outgoing struct {
	resp   *discovery.DeltaDiscoveryResponse
	flight *inflight
	cost   int64
}

type deltaWatch struct {
	w   *watch // the open watch, closed by cancel
	sub stream.Subscription
}

func (s *deltaStream) cancel(dw *deltaWatch) { s.cache.cancel(s.st, dw.w) }

// serveDelta serves one delta stream until the RPC ends, the client stops sending, its streamInfo's
// close ends it (the tracker, the server stopping, the response timeout: the stream's Recv and
// Send then return), or a request or a send fails (the stream is closed with the error).
func serveDelta(ctx context.Context, id int64, str discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, c *Cache, t *Tracker) error {
	s := &deltaStream{id: id, str: str, cache: c, tracker: t, close: streamInfoOf(ctx).close, watches: map[string]*deltaWatch{}}
	s.idle.L = &s.mu
	node := &core.Node{}
	defer func() {
		// Every way here has ended the stream (its close), so a send at work returns.
		s.mu.Lock()
		s.closed = true
		s.abandon() // before the watches: canceling the pending one waits for it
		for _, w := range s.watches {
			s.cancel(w)
		}
		for s.draining {
			s.idle.Wait()
		}
		s.mu.Unlock()
		t.OnDeltaStreamClosed(id, node)
	}()

	if err := t.OnDeltaStreamOpen(ctx, id, ""); err != nil {
		return err
	}
	if s.st = c.Session(id); s.st == nil {
		return status.Error(codes.Unavailable, "the stream's session is closed")
	}
	s.st.mu.Lock()
	s.st.sendNow, s.st.kick = s.sendNow, s.kick
	s.st.mu.Unlock()
	for {
		req, err := str.Recv()
		if err != nil {
			// The client closed its side, the RPC ended, the stream was closed with a status (the
			// tracker, the server stopping, the response timeout, or a failed send: then the
			// send's error is the stream's), or gRPC refused a request over the size bound
			// (refused). The stream ends first, so that nothing this loop then waits for is a send
			// that waits for the client.
			s.mu.Lock()
			failed := s.failed
			s.mu.Unlock()
			if failed == nil {
				failed = t.refused(s.st, err)
			}
			s.close(failed)
			return failed
		}
		s.handling.Store(true)
		err = s.request(req, &node)
		s.handling.Store(false)
		sent := s.flush(sendNowLimit) // more waits for the client to read: not on this goroutine
		if err != nil {
			s.close(err) // the client is told, and a send of another goroutine's ends
			return err
		}
		if s.kicked.Load() || !sent {
			// Kicked while this request was handled, after its pump, or left more to send.
			s.kicked.Store(true)
			go s.pumpKicked()
		}
	}
}

// kick has the session's queue sent by a goroutine started for it, unless one is due already or
// the RPC's goroutine is handling a request (it sends after the request, and looks again after).
// It neither waits nor locks: the session may call it under its own lock (Session.signal).
func (s *deltaStream) kick() {
	if s.kicked.Swap(true) || s.handling.Load() {
		return
	}
	go s.pumpKicked()
}

// pumpKicked sends the session's queue, as kick asked: a send may wait for the client to read; it
// ends with the stream at the latest.
func (s *deltaStream) pumpKicked() {
	s.run(func() error {
		s.kicked.Store(false)
		return s.pump()
	})
}

// awaitRoom waits for the budget to grant the pending response its room, or for abandon to take
// the response back (it wakes w then), and sends it and what was queued after it.
func (s *deltaStream) awaitRoom(w *budgetWaiter) {
	<-w.ready
	s.run(func() error {
		if s.wait != w {
			return nil // taken back meanwhile (abandon gave the room back)
		}
		s.deliver()
		return s.pump()
	})
}

// run runs f under the stream's lock, unless the stream has closed, then sends what is in the
// outbox; an error of f or of a send ends the stream.
func (s *deltaStream) run(f func() error) {
	s.mu.Lock()
	var err error
	if !s.closed {
		err = f()
	}
	s.mu.Unlock()
	s.flush(0)
	s.fail(err)
}

// fail ends the stream with err, a send's error (nil: nothing failed). The RPC's goroutine
// returns it.
func (s *deltaStream) fail(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	if s.failed == nil {
		s.failed = err
	}
	s.mu.Unlock()
	s.close(err)
}

// request handles one request of the client: what was answered goes out first, then the tracker
// hears the request and tells the observers (no lock held), and the type's watch is made anew.
func (s *deltaStream) request(req *discovery.DeltaDiscoveryRequest, node **core.Node) error {
	s.mu.Lock()
	err := s.pump()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.tracker.stalls {
		s.mu.Lock() // the emulation of the old behaviour: the observers stall the stream
	}
	tell, err := s.tracker.request(s.st, s.id, req)
	tell()
	if err != nil {
		if s.tracker.stalls {
			s.mu.Unlock()
		}
		return err
	}
	if !s.tracker.stalls {
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if s.closed || s.failed != nil {
		return s.failed
	}
	// The node might come on the first request only: every request carries it on.
	if req.GetNode() != nil {
		*node = req.GetNode()
	} else {
		req.Node = *node
	}
	kind := req.GetTypeUrl()
	if kind == "" {
		return status.Errorf(codes.InvalidArgument, "type URL is required for ADS")
	}
	w := s.watches[kind]
	var old *watch // the type's watch until now, which the new one may reuse
	if w == nil {
		// The legacy wildcard: a first request that names nothing subscribes to all.
		w = &deltaWatch{sub: stream.NewDeltaSubscription(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe(), req.GetInitialResourceVersions(), true)}
		s.watches[kind] = w
	} else {
		if s.pending != nil && s.pending.kind == kind {
			s.abandon() // its watch is canceled now: its names are dirty again for the next
		}
		s.cancel(w)
		old = w.w
		w.sub.UpdateResourceSubscriptions(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
	}
	// The watch reads the stream's subscription in place: a request changes it only once the
	// type's watch is canceled (above).
	w.w = s.cache.openWatch(s.st, req, &w.sub, nil, old)
	s.kicked.Store(false) // what was kicked until now is sent after this request
	return s.pump()
}

// pump hands the session's answered responses over to the outbox in order while the budget has
// room for them; the first that does not fit stays pending, queued in the budget, until it is
// granted room. Call with s.mu.
func (s *deltaStream) pump() error {
	_, err := s.pumpWhile(nil)
	return err
}

// pumpWhile is pump that also asks more, when not nil, before each response it takes, and stops
// where more says no. It reports whether it left the session's queue empty with nothing waiting.
// Call with s.mu.
func (s *deltaStream) pumpWhile(more func() bool) (bool, error) {
	if s.failed != nil {
		return false, s.failed
	}
	for s.wait == nil && (more == nil || more()) {
		if s.pending == nil {
			w := s.st.next()
			if w == nil {
				return true, nil
			}
			s.pending, s.cost = w, responseCost(w.resp.DeltaDiscoveryResponse)
		}
		if wait := s.cache.budget.tryAcquire(&s.st.acct, s.cost); wait != nil {
			s.wait = wait
			go s.awaitRoom(wait)
			return false, nil // the pending response waits for room
		}
		s.deliver()
	}
	return false, nil
}

// sendNowLimit bounds what a stream may have sent and not had answered for a send that must not
// wait (sendNow, and the RPC's goroutine): half of grpc-go's write quota of a stream (64 KiB),
// the bytes a send may find not yet written before it waits for them. What is unanswered
// includes all that is unwritten, so a send under this bound never waits, whatever the client does.
const sendNowLimit = 32 << 10

// sendNow is pump on the caller's goroutine (a write's fan-out), for as long as it cannot wait:
// the stream's lock is free (TryLock: a request being handled, or a pump at work, leaves it to
// them), the budget has room, and the stream's unanswered responses are under sendNowLimit. It
// reports whether it sent or left to another goroutine all the session's queue, or its first
// waits for room (awaitRoom sends it); on false the caller kicks the stream, which sends the
// rest. A failed send ends the stream.
func (s *deltaStream) sendNow() bool {
	if !s.mu.TryLock() {
		return false
	}
	if s.closed {
		s.mu.Unlock()
		return true // nothing is sent any more
	}
	drained, err := s.pumpWhile(func() bool { return s.st.unanswered() < sendNowLimit })
	waiting := s.wait != nil
	s.mu.Unlock()
	if err != nil {
		s.fail(err)
		return true
	}
	return s.flush(sendNowLimit) && (drained || waiting)
}

// deliver moves the pending response, whose room in the budget is taken, to the outbox, numbered
// with the stream's next nonce (a shared one has its own). Call with s.mu.
func (s *deltaStream) deliver() {
	w := s.pending
	s.pending, s.wait = nil, nil
	s.st.admitted(w, s.cost)
	out := outgoing{resp: w.resp.DeltaDiscoveryResponse, flight: w.flight, cost: s.cost}
	s.st.finish(w, true)
	if out.resp.Nonce == "" {
		s.nonce++
		out.resp.Nonce = strconv.FormatInt(s.nonce, 10)
	}
	s.outbox = append(s.outbox, out)
	s.unsent += out.cost
}

// flush sends what the outbox holds, in order, telling the tracker of each response first, with
// no lock held, unless another goroutine is at it (it sends what was added meanwhile too). With
// limit > 0 it sends only while what the stream sent and the client has not answered holds less
// than limit (a send that cannot wait), and reports false when it left some for another
// goroutine. A failed send ends the stream.
func (s *deltaStream) flush(limit int64) bool {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return true
	}
	s.draining = true
	var err error
	for s.head < len(s.outbox) && err == nil && s.failed == nil && !s.closed {
		if limit > 0 && s.st.unanswered()-s.unsent >= limit {
			break
		}
		out := s.outbox[s.head]
		s.outbox[s.head] = outgoing{}
		s.head++
		s.unsent -= out.cost
		s.mu.Unlock()
		s.tracker.sentFlight(s.st, s.id, out.resp, out.flight)
		err = s.str.Send(out.resp)
		s.mu.Lock()
	}
	left := s.head < len(s.outbox) && err == nil && s.failed == nil && !s.closed
	if !left {
		clear(s.outbox[s.head:])
		s.outbox, s.head, s.unsent = s.outbox[:0], 0, 0 // its room kept for the next
	}
	s.draining = false
	s.idle.Broadcast()
	s.mu.Unlock()
	s.fail(err)
	return !left
}

// abandon takes the pending response back, unsent: its names are dirty again. Call with s.mu.
func (s *deltaStream) abandon() {
	if w := s.pending; w != nil {
		if wait := s.wait; wait != nil {
			s.cache.budget.cancel(wait) // out of the queue, or its room given back
			select {
			case wait.ready <- struct{}{}: // awaitRoom ends (not granted: nothing else sends)
			default: // granted: ready holds its signal already
			}
		}
		s.pending, s.wait = nil, nil
		s.st.finish(w, false)
	}
}

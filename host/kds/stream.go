package kds

// The delta stream loop: go-control-plane's delta server loop (pkg/server/delta/v3, v0.14), with
// what KDS needs of it and no more. It differs in five ways. It ends when the server closes the
// stream (the tracker closes a stream that a newer one of its zone replaced) without waiting for
// the zone's next request: the server writes the stream's status through grpc-go's server
// stream, which ends its Recv and Send (server.go). It sends the session's answered responses
// itself, in their order, when the budget has room for them, instead of receiving them from a
// sender goroutine over a channel. It runs on one goroutine a stream, the RPC's own, which reads
// the zone's requests, handles each under the stream's lock and then sends what it answered
// (go-control-plane's runs two: the RPC's, and one reading requests); what is answered between
// requests is sent by a write's fan-out itself when the stream is in step (sendNow), otherwise by
// a goroutine started for it (kick) or for the room it waits for (awaitRoom), which ends once it
// has sent. It keeps no copy of what each subscription was sent (the session keeps what the zone
// holds). And its state grows with the kinds the zone asks for, not with every kind there is.
// Callbacks are called in the order that loop calls them, one at a time (the stream's lock), from
// whichever goroutine holds it.

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deltaStream is one stream's state in the loop. The RPC's goroutine, the fan-out (sendNow) and
// the goroutines started to send (kick, awaitRoom) change it and send on the stream under mu.
type deltaStream struct {
	mu      sync.Mutex
	closed  bool  // the loop has ended: nothing is sent any more
	failed  error // a send failed: the stream ends with it
	close   context.CancelCauseFunc
	id      int64
	str     discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	cache   *Cache
	tracker *Tracker
	st      *Session
	nonce   int64
	watches map[string]*deltaWatch

	// kicked: a send of the session's queue is due, and a goroutine is started for it or the
	// RPC's goroutine sends once the request it handles (handling) is done.
	kicked   atomic.Bool
	handling atomic.Bool

	// pending is the answered watch taken off the session's queue whose response waits for room
	// in the budget (cost bytes of it), queued there as wait: until the budget grants it (freed),
	// or, at the deadline, it goes anyway; awaitRoom waits for either.
	pending  *watch
	cost     int64
	wait     *budgetWaiter
	freed    <-chan struct{}
	timer    *time.Timer
	deadline <-chan time.Time
}

type deltaWatch struct {
	w   *watch // the open watch, closed by cancel
	sub stream.Subscription
}

func (s *deltaStream) cancel(dw *deltaWatch) { s.cache.cancel(s.st, dw.w) }

// serveDelta serves one delta stream until the RPC ends, the zone stops sending, its streamInfo's
// close ends it (the tracker, the server stopping: the stream's Recv and Send then return), or a
// request or a send fails (the stream is closed with the error).
func serveDelta(ctx context.Context, id int64, str discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, c *Cache, t *Tracker) error {
	s := &deltaStream{id: id, str: str, cache: c, tracker: t, close: streamInfoOf(ctx).close, watches: map[string]*deltaWatch{}}
	node := &core.Node{}
	defer func() {
		s.mu.Lock()
		s.closed = true
		s.abandon() // before the watches: canceling the pending one waits for it
		for _, w := range s.watches {
			s.cancel(w)
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
			// The zone closed its side, the RPC ended, the stream was closed with a status
			// (the tracker, the server stopping, or a failed send: then the send's error is the
			// stream's), or gRPC refused a request over the size bound (refused).
			s.mu.Lock()
			failed := s.failed
			s.mu.Unlock()
			if failed == nil {
				failed = t.refused(s.st, err)
			}
			return failed
		}
		s.handling.Store(true)
		s.mu.Lock()
		err = s.request(req, &node)
		if err == nil {
			s.kicked.Store(false) // what was kicked until now is sent here
			err = s.pump()
		}
		s.mu.Unlock()
		s.handling.Store(false)
		if err != nil {
			s.close(err) // the zone is told, and a send of another goroutine's ends
			return err
		}
		if s.kicked.Load() {
			go s.pumpKicked() // kicked while this request was handled, after its pump
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

// pumpKicked sends the session's queue, as kick asked: a send may wait for the zone to read, as
// the RPC's goroutine's may; it ends with the stream at the latest.
func (s *deltaStream) pumpKicked() {
	s.fail(s.locked(func() error {
		s.kicked.Store(false)
		return s.pump()
	}))
}

// awaitRoom waits for the budget to grant the pending response its room (freed), or for its
// deadline, and sends it and what was queued after it. abandon wakes it when the response is
// taken back (freed no longer the stream's; a wait's freed and deadline are set and cleared
// together).
func (s *deltaStream) awaitRoom(freed <-chan struct{}, deadline <-chan time.Time) {
	late := false
	select {
	case <-freed: // the budget took the room for it
	case <-deadline:
		late = true
	}
	s.fail(s.locked(func() error {
		if s.freed != freed {
			return nil // delivered or taken back meanwhile (abandon gave the room back)
		}
		if late {
			// Waited long enough: over the limit, rather than stalled by zones that do not answer.
			s.cache.budget.force(s.wait)
		}
		return s.deliverAndPump()
	}))
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

// locked runs f under the stream's lock, unless the stream has closed.
func (s *deltaStream) locked(f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return f()
}

// request handles one request of the zone: what was answered goes out first, then the tracker
// hears the request, and the kind's watch is made anew. Call with s.mu.
func (s *deltaStream) request(req *discovery.DeltaDiscoveryRequest, node **core.Node) error {
	if err := s.pump(); err != nil {
		return err
	}
	if err := s.tracker.request(s.st, s.id, req); err != nil {
		return err
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
	var old *watch // the kind's watch until now, which the new one may reuse
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
	// kind's watch is canceled (above).
	w.w = s.cache.openWatch(s.st, req, &w.sub, nil, old)
	return nil
}

// pump sends the session's answered responses in order while the budget has room for them; the
// first that does not fit stays pending, queued in the budget, until it is granted room or its
// deadline.
func (s *deltaStream) pump() error {
	_, err := s.pumpWhile(nil)
	return err
}

// pumpWhile is pump that also asks more, when not nil, before each response it takes, and stops
// where more says no. It reports whether it left the session's queue empty with nothing waiting.
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
		if wait := s.cache.budget.tryAcquire(s.cost); wait != nil {
			s.wait, s.freed = wait, wait.ready
			s.timer = time.NewTimer(s.cache.budget.maxWait)
			s.deadline = s.timer.C
			go s.awaitRoom(s.freed, s.deadline)
			return false, nil // the pending response waits for room
		}
		if err := s.deliver(); err != nil {
			return false, err
		}
	}
	return false, nil
}

// sendNowLimit bounds what a stream may have sent and not had answered for sendNow to send more:
// half of grpc-go's write quota of a stream (64 KiB), the bytes a send may find not yet written
// before it waits for them. What is unanswered includes all that is unwritten, so a send under
// this bound never waits, whatever the zone does.
const sendNowLimit = 32 << 10

// sendNow is pump on the caller's goroutine (a write's fan-out), for as long as it cannot wait:
// the stream's lock is free (TryLock: a request being handled, or a send at work, leaves it to
// them), the budget has room, and the stream's unanswered responses are under sendNowLimit. It
// reports whether the session's queue is empty or its first waits for room (awaitRoom sends it);
// on false the caller kicks the stream, which sends the rest. A failed send ends the stream.
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
	s.fail(err)
	return drained || waiting || err != nil
}

// deliver sends the pending response, whose room in the budget is taken.
func (s *deltaStream) deliver() error {
	w := s.pending
	s.pending, s.wait, s.freed = nil, nil, nil
	s.stopTimer()
	s.st.admitted(w, s.cost)
	resp := w.resp
	s.st.finish(w, true)
	return s.send(resp.DeltaDiscoveryResponse)
}

// deliverAndPump sends the pending response, whose room is taken, and what was queued after it.
func (s *deltaStream) deliverAndPump() error {
	if err := s.deliver(); err != nil {
		return err
	}
	return s.pump()
}

// abandon takes the pending response back, unsent: its names are dirty again.
func (s *deltaStream) abandon() {
	if w := s.pending; w != nil {
		if wait := s.wait; wait != nil {
			s.cache.budget.cancel(wait) // out of the queue, or its room given back
			select {
			case wait.ready <- struct{}{}: // awaitRoom ends (not granted: nothing else sends)
			default: // granted: ready holds its signal already
			}
		}
		s.pending, s.wait, s.freed = nil, nil, nil
		s.stopTimer()
		s.st.finish(w, false)
	}
}

func (s *deltaStream) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer, s.deadline = nil, nil
	}
}

// send numbers a response with the stream's next nonce (a shared one has its own), tells the
// tracker, and sends it.
func (s *deltaStream) send(r *discovery.DeltaDiscoveryResponse) error {
	if r.Nonce == "" {
		s.nonce++
		r.Nonce = strconv.FormatInt(s.nonce, 10)
	}
	s.tracker.sent(s.st, s.id, r)
	return s.str.Send(r)
}

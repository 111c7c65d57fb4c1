package kds

// The delta stream loop: go-control-plane's delta server loop (pkg/server/delta/v3, v0.14), with
// what KDS needs of it and no more. It differs in four ways: it ends when the stream's own
// context does (the tracker closes a stream that a newer one of its zone replaced, and the loop
// must end without waiting for the zone's next request); it sends the session's answered
// responses itself, in their order, when the budget has room for them, instead of receiving them
// from a sender goroutine over a channel (two goroutines a stream: this one and the one reading
// requests); it keeps no copy of what each subscription was sent (the session keeps what the
// zone holds); and its state grows with the kinds the zone asks for, not with every kind there
// is. Callbacks are called as that loop calls them.

import (
	"context"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
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
	st      *Session
	nonce   int64
	watches map[string]*deltaWatch

	// pending is the answered watch taken off the session's queue whose response waits for room
	// in the budget (cost bytes of it), queued there as wait: until the budget grants it (freed),
	// or, at the deadline, it goes anyway.
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

// serveDelta serves one delta stream until ctx ends (the RPC ended, the tracker closed it, or the
// server stops), the zone stops sending, or a callback or send fails.
func serveDelta(ctx context.Context, id int64, str discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer, c *Cache, t *Tracker) error {
	s := &deltaStream{id: id, str: str, cache: c, tracker: t, watches: map[string]*deltaWatch{}}
	node := &core.Node{}
	defer func() {
		s.abandon() // before the watches: canceling the pending one waits for it
		for _, w := range s.watches {
			s.cancel(w)
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
	if s.st = c.Session(id); s.st == nil {
		return status.Error(codes.Unavailable, "the stream's session is closed")
	}
	for {
		var err error
		select {
		case <-ctx.Done(): // the RPC ended, the tracker closed it, or the cache is closing
			return nil
		case <-s.st.wake:
			err = s.pump()
		case <-s.freed: // the budget took the room for it
			err = s.deliverAndPump()
		case <-s.deadline:
			// Waited long enough: over the limit, rather than stalled by zones that do not answer.
			c.budget.force(s.wait)
			err = s.deliverAndPump()
		case req, more := <-requests:
			if !more {
				return nil // the zone closed its side, or the RPC ended
			}
			err = s.request(req, &node)
		}
		if err != nil {
			return err
		}
	}
}

// request handles one request of the zone: what was answered goes out first, then the tracker
// hears the request, and the kind's watch is made anew.
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
	if w == nil {
		// The legacy wildcard: a first request that names nothing subscribes to all.
		w = &deltaWatch{sub: stream.NewDeltaSubscription(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe(), req.GetInitialResourceVersions(), true)}
		s.watches[kind] = w
	} else {
		if s.pending != nil && s.pending.kind == kind {
			s.abandon() // its watch is canceled now: its names are dirty again for the next
		}
		s.cancel(w)
		w.sub.UpdateResourceSubscriptions(req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
	}
	// The watch reads the stream's subscription in place: a request changes it only once the
	// kind's watch is canceled (above).
	w.w = s.cache.openWatch(s.st, req, &w.sub, nil)
	return nil
}

// pump sends the session's answered responses in order while the budget has room for them; the
// first that does not fit stays pending, queued in the budget, until it is granted room or its
// deadline.
func (s *deltaStream) pump() error {
	for s.wait == nil {
		if s.pending == nil {
			w := s.st.next()
			if w == nil {
				return nil
			}
			s.pending, s.cost = w, responseCost(w.resp.DeltaDiscoveryResponse)
		}
		if wait := s.cache.budget.tryAcquire(s.cost); wait != nil {
			s.wait, s.freed = wait, wait.ready
			s.timer = time.NewTimer(s.cache.budget.maxWait)
			s.deadline = s.timer.C
			return nil
		}
		if err := s.deliver(); err != nil {
			return err
		}
	}
	return nil // the pending response waits for room
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
		if s.wait != nil {
			s.cache.budget.cancel(s.wait) // out of the queue, or its room given back
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

// send numbers a response with the stream's next nonce, tells the tracker, and sends it.
func (s *deltaStream) send(r *discovery.DeltaDiscoveryResponse) error {
	s.nonce++
	r.Nonce = strconv.FormatInt(s.nonce, 10)
	s.tracker.sent(s.st, s.id, r)
	return s.str.Send(r)
}

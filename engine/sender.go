package engine

// A session's sender: the responses its watches made, handed to go-control-plane's server in
// order, with the room each holds in the byte budget, and taken back when not delivered.

import (
	"slices"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// send is the session's sender, for a stream that go-control-plane's delta server serves (a
// stream of the engine's own loop is its loop's, stream.go): it feeds queued responses into the
// server's channel in order. A response counts as delivered from the moment it is handed over;
// one that is not (its watch canceled meanwhile) is taken back. cancel waits for a send in
// progress.
func (s *Session) send() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		for {
			w := s.next()
			if w == nil {
				break
			}
			stopped, delivered := false, false
			if s.admit(w) {
				if w.sotwOut != nil {
					select {
					case w.sotwOut <- &w.sotwResp:
						delivered = true
					case <-w.canceled:
					case <-s.stop:
					}
				} else {
					select {
					case w.out <- w.resp:
						delivered = true
					case <-w.canceled:
					case <-s.stop:
					}
				}
			}
			select {
			case <-s.stop:
				stopped = true
			default:
			}
			s.finish(w, delivered)
			if stopped {
				return
			}
		}
	}
}

// finish is the sender done with w: its response delivered, or taken back.
func (s *Session) finish(w *watch, delivered bool) {
	s.mu.Lock()
	if !delivered {
		s.takeBack(w)
	}
	w.undo, w.resp, w.flight = nil, nil, nil // done with them; the watch stays answered
	s.mu.Unlock()
	if w.finished != nil {
		close(w.finished)
	}
}

// admit waits for room in the cache's budget for w's response, and reports whether it got it
// (false: the stream closed or the watch was canceled meanwhile). The room is the response's
// until the node answers it, or it leaves the responses in flight otherwise.
func (s *Session) admit(w *watch) bool {
	cost := responseCost(w.resp.DeltaDiscoveryResponse)
	if !s.cache.budget.acquire(&s.acct, cost, s.stop, w.canceled) {
		return false
	}
	s.admitted(w, cost)
	return true
}

// admitted gives w's response the room it took in the budget.
func (s *Session) admitted(w *watch, cost int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Contains(s.inflight, w.flight) {
		w.flight.cost, w.flight.since = cost, time.Now()
		s.armStallLocked()
	} else {
		s.cache.budget.release(&s.acct, cost) // answered or forgotten meanwhile (a test driving the callbacks)
	}
}

// next takes the first queued watch off the queue and counts its response as delivered, or
// returns nil.
func (s *Session) next() *watch {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil
	}
	w := s.queue[0]
	s.queue = slices.Delete(s.queue, 0, 1) // the queue keeps its room: a slice a response, not one each
	w.sending = true
	ks := w.ks
	w.flight, w.undo = s.handOverLocked(ks, w.kind, w.resp.DeltaDiscoveryResponse, &w.record, w.undoBuf[:0])
	w.flight.sotw, w.flight.again = w.sotwResp.resp, w.sotwResp.again
	for _, n := range w.forced {
		delete(ks.forced, n)
	}
	ks.resent += int64(len(w.forced))
	return w
}

// handOverLocked counts a response as handed to the server: delivered, and in flight with what
// the node had ACKed of its names. It returns the in-flight record (r, when not nil) and what
// delivered had of the names it carries (appended to undo), for takeBack. Call with s.mu.
func (s *Session) handOverLocked(ks *kindState, kind string, resp *discovery.DeltaDiscoveryResponse, r *inflight, undo []prior) (*inflight, []prior) {
	// With nothing of the type refused or in flight, what the node ACKed is what it was
	// delivered: one lookup a name.
	layered := s.layered(ks, kind, nil)
	if !slices.IsSortedFunc(resp.Resources, byName) { // the cache's are; a test's may not be
		slices.SortFunc(resp.Resources, byName)
	}
	if !slices.IsSorted(resp.RemovedResources) {
		slices.Sort(resp.RemovedResources)
	}
	if r == nil {
		r = &inflight{}
	}
	*r = inflight{kind: kind, ks: ks, resp: resp}
	first := ks.delivered.len() == 0
	note := func(name string) {
		if first && !layered {
			return // nothing delivered, nothing ACKed: no prior, nothing to undo
		}
		old, had := ks.delivered.get(name)
		if had {
			undo = append(undo, prior{name, old})
		}
		switch {
		case layered:
			r.setPrior(name, s.ackedLocked(kind, name))
		case had:
			r.setPrior(name, ackedVersion{old.Version, true})
		}
	}
	if cur := s.snapshot(); cur != nil && first && !layered && len(resp.RemovedResources) == 0 && ks.delivered.sentAll(cur, kind, resp.Resources) {
		ks.edits += uint64(len(resp.Resources)) // as setDelivered counts them; no prior, nothing to undo
		r.all, r.allSum = true, cur.order(kind).acked
	} else {
		for _, res := range resp.Resources {
			note(res.Name)
		}
		for _, n := range resp.RemovedResources {
			note(n)
		}
		// What the node is sent now is most often exactly what is served: share the snapshot's.
		if ks.delivered.advance(cur, kind, resp.Resources, resp.RemovedResources) {
			ks.edits += uint64(len(resp.Resources) + len(resp.RemovedResources)) // as setDelivered and dropDelivered count them
		} else {
			for _, res := range resp.Resources {
				ks.setDelivered(res.Name, res)
			}
			for _, n := range resp.RemovedResources {
				ks.dropDelivered(n)
			}
			ks.delivered.rebase(cur, kind)
		}
	}
	r.edits = ks.edits
	s.inflight = append(s.inflight, r)
	if len(s.inflight) > MaxInFlight {
		s.forgetLocked(s.inflight[0])
	}
	return r, undo
}

// takeBack undoes a response that was not delivered: what the node was sent is as before, and
// its names are dirty again (forced ones forced again). Call with s.mu.
func (s *Session) takeBack(w *watch) {
	ks := w.ks
	w.eachName(ks.dropDelivered)
	for _, p := range w.undo {
		ks.setDelivered(p.name, p.was)
	}
	if w.flight != nil {
		s.dropLocked(w.flight)
	}
	s.requeue(w)
	for _, n := range w.forced {
		ks.markForced(n)
	}
	ks.resent -= int64(len(w.forced)) // not sent after all
}

// requeue makes the names of an answered, undelivered response dirty again. Call with s.mu.
func (s *Session) requeue(w *watch) {
	ks := w.ks
	w.eachName(ks.markDirty)
}

// prior is what delivered had for a name.
type prior struct {
	name string
	was  *discovery.Resource
}

// watch is one open delta watch: the server's request for a type, answered at most once.
type watch struct {
	kind string     // the type URL
	ks   *kindState // the session's state of kind
	req  *discovery.DeltaDiscoveryRequest
	sub  cache.Subscription
	out  chan cache.DeltaResponse

	answered    bool                            // at most once
	resp        *cache.DeltaPassthroughResponse // the answer (answer), until it is delivered
	undo        []prior                         // what delivered had before the response, of the names it had
	flight      *inflight                       // the response in flight, until it is delivered
	forced      []string                        // forced names the response carries
	wasCanceled bool                            // cancel ran
	canceled    chan struct{}                   // closed by cancel (nil in the engine's own stream loop)
	finished    chan struct{}                   // closed by the sender when it is done with this watch (nil in the engine's own stream loop)
	sending     bool                            // the sender has taken it off the queue

	// A SotW watch (go-control-plane's SotW server): its request, its channel, and the response
	// sent on it, made with resp (which records the delta it makes).
	sotwReq  *discovery.DiscoveryRequest
	sotwOut  chan cache.Response
	sotwResp sotwResponse

	// What a response allocates, in the watch's own allocation: a watch answers once, and most
	// answers carry one resource to a node that held one version of it (an update). The response
	// itself is most often the one every stream is sent (Cache.shared), made once: a stream's own
	// is allocated when it is made.
	answer struct {
		pass cache.DeltaPassthroughResponse
		res  [1]*discovery.Resource
	}
	record  inflight
	undoBuf [1]prior
}

// subscribes reports whether the watch's subscription covers name.
func (w *watch) subscribes(name string) bool {
	if w.sub.IsWildcard() {
		return true
	}
	_, ok := w.sub.SubscribedResources()[name]
	return ok
}

// eachName calls f with every name the watch's response carries, sent or removed.
func (w *watch) eachName(f func(name string)) {
	for _, r := range w.resp.DeltaDiscoveryResponse.Resources {
		f(r.Name)
	}
	for _, n := range w.resp.DeltaDiscoveryResponse.RemovedResources {
		f(n)
	}
}

package engine

// A session's sender: its watches' responses, handed to go-control-plane's server in order.

import (
	"slices"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// send is the sender of a stream go-control-plane's server serves, started when its queue grows
// (signal): it feeds the queued responses into their channels in order, and returns once the
// queue is empty or the stream closes. One not handed over (its watch canceled) is taken back;
// cancel waits for a send in progress.
func (s *Session) send() {
	for w := s.take(); w != nil; w = s.take() {
		delivered := false
		if s.admit(w) {
			select { // one of out and sotwOut is nil: a SotW watch's or a delta one's
			case w.sotwOut <- &w.sotwResp:
				delivered = true
			case w.out <- w.resp:
				delivered = true
			case <-w.canceled:
			case <-s.stop:
			}
		}
		s.finish(w, delivered)
		select {
		case <-s.stop:
			return
		default:
		}
	}
}

// take is next for the sender: with the queue empty, the sender is done until signal starts it again.
func (s *Session) take() *watch {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.nextLocked()
	s.senderRuns = w != nil
	return w
}

// finish is the sender done with w: its response delivered, or taken back (what the node was
// sent is as before, and its names are dirty again, forced ones forced again).
func (s *Session) finish(w *watch, delivered bool) {
	s.mu.Lock()
	if ks := w.ks; !delivered {
		eachName(w.resp.DeltaDiscoveryResponse, ks.dropDelivered)
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
	w.undo, w.resp, w.flight = nil, nil, nil // done with them; the watch stays answered
	s.mu.Unlock()
	if w.finished != nil {
		close(w.finished)
	}
}

// admit waits for room in the budget for w's response, and reports whether it got it.
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

// next takes the first queued watch off the queue and hands its response over, or returns nil.
func (s *Session) next() *watch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextLocked()
}

func (s *Session) nextLocked() *watch {
	if len(s.queue) == 0 {
		return nil
	}
	w := s.queue[0]
	s.queue = slices.Delete(s.queue, 0, 1) // keeps its room
	w.sending = true
	ks := w.ks
	w.flight, w.undo = s.handOverLocked(ks, w.kind, w.resp.DeltaDiscoveryResponse, &w.record, w.undoBuf[:0])
	w.flight.sotw, w.flight.again, w.flight.againAll = w.sotwResp.resp, w.sotwResp.again, w.sotwResp.againAll
	for _, n := range w.forced {
		delete(ks.forced, n)
	}
	ks.resent += int64(len(w.forced))
	return w
}

// handOverLocked counts a response as handed to the server: delivered, and in flight with what
// the node had ACKed of its names. It returns the in-flight record (r, when not nil) and what
// delivered had of the names it carries (appended to undo), for finish. Call with s.mu.
func (s *Session) handOverLocked(ks *kindState, kind string, resp *discovery.DeltaDiscoveryResponse, r *inflight, undo []prior) (*inflight, []prior) {
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
		eachName(resp, note)
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

// requeue makes the names of an answered, undelivered response dirty again. Call with s.mu.
func (s *Session) requeue(w *watch) { eachName(w.resp.DeltaDiscoveryResponse, w.ks.markDirty) }

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
	// A SotW watch's request, channel, and response, made with resp (the delta it makes).
	sotwReq  *discovery.DiscoveryRequest
	sotwOut  chan cache.Response
	sotwResp sotwResponse
	// What a response allocates, in the watch's own allocation (a watch answers once).
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

// eachName calls f with every name resp carries, sent or removed.
func eachName(resp *discovery.DeltaDiscoveryResponse, f func(name string)) {
	for _, r := range resp.Resources {
		f(r.Name)
	}
	for _, n := range resp.RemovedResources {
		f(n)
	}
}

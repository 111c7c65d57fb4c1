package engine

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
)

// stallTimer closes a stream of the engine's own loop whose oldest response stays unanswered past
// Limits.ResponseTimeout. It is armed when a response in flight gets its room, and looks again
// when it fires (an answer costs no timer operation). Guarded by the session's mu.
type stallTimer struct {
	t     *time.Timer
	armed bool
	done  bool // the stream closed, or was closed by the timer: never armed again
}

// armStallLocked arms the stall timer of a stream of the engine's own loop. Call with s.mu.
func (s *Session) armStallLocked() {
	if s.stall.armed || s.stall.done || !s.info.loop {
		return
	}
	d := time.Duration(s.cache.responseTimeout.Load())
	if d <= 0 {
		return
	}
	s.stall.armed = true
	if s.stall.t == nil {
		s.stall.t = time.AfterFunc(d, s.checkStall)
	} else {
		s.stall.t.Reset(d)
	}
}

// stop disarms the timer for good. Call with the session's mu.
func (st *stallTimer) stop() {
	st.done, st.armed = true, false
	if st.t != nil {
		st.t.Stop()
	}
}

// checkStall runs when the stall timer fires: it closes the stream if its oldest response has
// been unanswered for the timeout, or arms the timer for when it will have been.
func (s *Session) checkStall() {
	d := time.Duration(s.cache.responseTimeout.Load())
	s.mu.Lock()
	s.stall.armed = false
	// Responses get their room in order: the first in flight that has one is the oldest sent.
	if s.stall.done || d <= 0 || len(s.inflight) == 0 || s.inflight[0].since.IsZero() {
		s.mu.Unlock()
		return
	}
	oldest := s.inflight[0]
	if wait := d - time.Since(oldest.since); wait > 0 {
		s.stall.armed = true
		s.stall.t.Reset(wait)
		s.mu.Unlock()
		return
	}
	s.stall.done = true
	zone, kind := s.node, oldest.kind
	var bytes int64
	for _, r := range s.inflight {
		bytes += r.cost
	}
	s.mu.Unlock()
	msg := fmt.Sprintf("zone %q has not answered a %s response for %s (%d bytes sent and unanswered): it does not read what it is sent, or its window is full; the global closes its stream (--kds-response-timeout), and the zone may connect again",
		zone, kind, d, bytes)
	s.info.close(status.Error(codes.DeadlineExceeded, msg))
	// The status waits behind what the client does not read: only the connection's end ends it.
	if s.info.drop != nil && s.info.drop() {
		msg += "; its connection is closed"
	}
	if report := s.cache.onStall; report != nil {
		report(event.Refusal{Reason: "stalled", Node: zone, Detail: msg})
	}
}

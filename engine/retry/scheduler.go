package retry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/shared"
)

// Resender makes a stream send named resources again (the cache's Resend), for the blocking
// emulation of the old behaviour.
type Resender interface {
	Resend(streamID int64, names map[string][]string)
}

// Session is a client stream's session as the scheduler steps it (the engine's Session): the
// stream's retry state lives in it, and its events run one at a time through it.
type Session interface {
	// Do runs f after the work given before it, one at a time; it returns at once when the
	// session is busy (see serial.Queue).
	Do(f func())
	// Retry is the stream's retry state.
	Retry() *Stream
	// Resend makes the stream send the named resources (type URL -> names) again. It must
	// return without waiting for the client.
	Resend(names map[string][]string)
}

// Stream is the retry state of one client stream, kept in its session: its Machine and the one
// timer the Machine asked for. The zero value is a stream the scheduler has not opened.
type Stream struct {
	mu     sync.Mutex // guards the fields; held while a transition runs, never while calling out
	m      *Machine
	timer  *time.Timer
	closed bool

	// quiet is set after each transition: the Machine has nothing failing, nothing outstanding
	// and nothing to reset (Machine.quiet), so a Sent or an ACK would change nothing but its
	// token. steps counts the transitions given to the session and not yet run. Together they
	// let the stream's own goroutine skip the session for such an event (Scheduler.skips): a
	// stream's events are observed on its goroutine in order, so a NACK given before an ACK has
	// been counted in steps when the ACK is looked at.
	quiet atomic.Bool
	steps atomic.Int32
}

// Close stops the stream's timer for good (its stream closed); later events change nothing.
func (st *Stream) Close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	st.stopTimer()
}

// Failing reports, without copying the state, whether the stream has names the policy still
// works on, and whether the policy gave up on it.
func (st *Stream) Failing() (failing, givenUp bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		return false, false
	}
	return len(st.m.failing) > 0, st.m.givenUp != ""
}

// State is the stream's retry state as insights show it, nil before the scheduler opened it.
func (st *Stream) State() *StreamState {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		return nil
	}
	ss := st.m.State()
	return &ss
}

func (st *Stream) stopTimer() {
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// Hooks are told what the scheduler does, for metrics. Any may be nil.
type Hooks struct {
	// PolicyCall reports one decision: how long the policy (fallback included) took, and the
	// error when no policy answered.
	PolicyCall func(node string, latency time.Duration, err error)
	// Round reports a fired round: the delay it waited and the resources resent per type URL.
	Round func(node string, delay time.Duration, resent map[string]int)
	// Decided reports each policy answer a stream acted on (for the DEBUG log).
	Decided func(node string, d Decision)
	// GaveUp reports a give-up.
	GaveUp func(node, reason string)
	// Parked reports names the policy parks until their content changes.
	Parked func(node string, parked []ParkedName)
	// Released reports names resent at once, by type URL, because the owner they missed arrived.
	Released func(node string, resent map[string]int)
}

// Config is a Scheduler's collaborators.
type Config struct {
	// Policy decides every round; Standard composes the usual chain (deadline, checks, fallback).
	// It must return within a bounded time.
	Policy shared.RetryForcer
	// Sessions finds a stream's session while it is open (the cache's Session); nil once closed.
	Sessions func(streamID int64) Session
	Hooks    Hooks
}

// Scheduler drives the Machine of every client stream, each kept in the stream's session: it feeds
// them the stream events through the session, calls the policy off the stream's goroutine,
// arms each stream's one timer, and resends what a round names. State lives in the sessions,
// never in a policy or in the scheduler, so a policy that crashes or is swapped loses nothing,
// and streams share no lock.
type Scheduler struct {
	cfg Config

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex     // orders starting a decision (wg.Add) before Close's wg.Wait
	closed bool           // under mu: no decision starts
	wg     sync.WaitGroup // decisions in flight
}

// NewScheduler returns a scheduler; Close cancels its decisions and waits for them.
func NewScheduler(cfg Config) (*Scheduler, error) {
	if cfg.Policy == nil || cfg.Sessions == nil {
		return nil, errors.New("retry: Policy and Sessions are required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{cfg: cfg, ctx: ctx, cancel: cancel}, nil
}

// Observer is how the scheduler hears of stream events. Each returns at once.
func (s *Scheduler) Observer() event.Observer {
	return event.Observer{
		StreamOpened: func(id int64, node string) {
			if sess := s.cfg.Sessions(id); sess != nil {
				sess.Do(func() {
					st := sess.Retry()
					st.mu.Lock()
					defer st.mu.Unlock()
					if st.m == nil {
						st.m = NewMachine(id, node)
						st.quiet.Store(true)
					}
				})
			}
		},
		// A step runs later, on the session's queue, and an event's Versions are read in place
		// only during the call: a stepped event takes a copy of them.
		Sent: func(e event.Sent) {
			if !s.skips(e.StreamID) {
				s.stepSent(e)
			}
		},
		ACK: func(a event.ACK) {
			if !s.skips(a.StreamID) {
				s.stepACK(a)
			}
		},
		NACK: func(n event.NACK) { s.step(n.StreamID, func(m *Machine) Ready { return m.NACK(n, time.Now()) }) },
		// A stream's state goes with its session: the cache closes its Stream when the stream
		// closes, and nothing here keeps it.
	}
}

// Close cancels the decisions in flight and waits for them; each returns at once on cancel,
// whatever its policy does. Later events and timers change nothing.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// stepSent and stepACK step a copy of the event; apart from the observers, so that an event
// that needs no step is not moved to the heap.
func (s *Scheduler) stepSent(e event.Sent) {
	e.Versions = e.Versions.Copy()
	s.step(e.StreamID, func(m *Machine) Ready { return m.Sent(e, time.Now()) })
}

func (s *Scheduler) stepACK(a event.ACK) {
	a.Versions = a.Versions.Copy()
	s.step(a.StreamID, func(m *Machine) Ready { return m.ACK(a, time.Now()) })
}

// step runs one transition of a stream's Machine, in the session's order, and carries out what
// it asks.
//
// A stream's transitions and the resends they ask for happen in one order: the session runs one
// piece of work at a time, and a transition's work includes carrying out what the Machine asked,
// resend included. So an event never overtakes a resend decided before it (an ACK applied
// between a round and its resend would see the round's names forced again after the client stored
// them), and the xDS callbacks never wait for a resend: the session queues theirs, and they
// return.
func (s *Scheduler) step(id int64, transition func(m *Machine) Ready) {
	sess := s.cfg.Sessions(id)
	if sess == nil || s.ctx.Err() != nil {
		return
	}
	st := sess.Retry()
	st.steps.Add(1)
	sess.Do(func() {
		defer st.steps.Add(-1)
		st.mu.Lock()
		if st.m == nil || st.closed || s.ctx.Err() != nil {
			st.mu.Unlock()
			return
		}
		r := transition(st.m)
		st.quiet.Store(st.m.quiet())
		s.applyLocked(id, st, r)
		node := st.m.node
		st.mu.Unlock()
		// Outside the lock: the session's resend takes the cache's, and hooks are the caller's
		// code. Both may step this stream again: that step waits in the session's queue.
		s.carryOut(sess, node, r)
	})
}

// skips reports whether a Sent or an ACK of the stream can go unstepped: its Machine is quiet
// and no transition of it waits in its session (Stream.quiet), so the event would change
// nothing. Most events of a stream in step are these, and each costs then two atomic loads
// instead of a trip through the session.
func (s *Scheduler) skips(id int64) bool {
	sess := s.cfg.Sessions(id)
	if sess == nil {
		return true // closed: step would do nothing either
	}
	st := sess.Retry()
	return st.quiet.Load() && st.steps.Load() == 0
}

// applyLocked starts the timer and the decision a transition asks for. Call with st.mu.
func (s *Scheduler) applyLocked(id int64, st *Stream, r Ready) {
	if r.Disarm {
		st.stopTimer()
	}
	if r.Arm > 0 {
		st.stopTimer()
		token := r.Token
		st.timer = time.AfterFunc(r.Arm, func() {
			s.step(id, func(m *Machine) Ready { return m.Fired(token, time.Now()) })
		})
	}
	if r.Ask != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return // a transition that raced Close: its decision is never made
		}
		s.wg.Add(1)
		go s.decide(id, st.m.node, r)
	}
}

// carryOut reports a transition to the hooks and makes the resend it asks for.
func (s *Scheduler) carryOut(sess Session, node string, r Ready) {
	if r.Round != nil && s.cfg.Hooks.Round != nil {
		s.cfg.Hooks.Round(node, r.Round.Delay, r.Round.Resent)
	}
	if r.Decision != nil && s.cfg.Hooks.Decided != nil {
		s.cfg.Hooks.Decided(node, *r.Decision)
	}
	if r.GaveUp != "" && s.cfg.Hooks.GaveUp != nil {
		s.cfg.Hooks.GaveUp(node, r.GaveUp)
	}
	if len(r.Parked) > 0 && s.cfg.Hooks.Parked != nil {
		s.cfg.Hooks.Parked(node, r.Parked)
	}
	if len(r.Released) > 0 && s.cfg.Hooks.Released != nil {
		s.cfg.Hooks.Released(node, r.Released)
	}
	if len(r.Resend) > 0 {
		sess.Resend(r.Resend)
	}
}

// decide asks the policy for the schedule a Machine asked for, and hands it the answer.
func (s *Scheduler) decide(id int64, node string, r Ready) {
	defer s.wg.Done()
	start := time.Now()
	resp, err := s.cfg.Policy.Schedule(s.ctx, r.Ask)
	if s.cfg.Hooks.PolicyCall != nil {
		s.cfg.Hooks.PolicyCall(node, time.Since(start), err)
	}
	s.step(id, func(m *Machine) Ready { return m.Decided(r.Token, resp, err, time.Now()) })
}

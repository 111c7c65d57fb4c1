package retry

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/shrink"
	"github.com/kds-host/kds-host/shared"
)

// Resender makes a stream send named resources again (kds.Cache.Resend). Resend must return
// without waiting for the zone; it may tell the scheduler of the stream's events (a test's zone
// that answers at once): those are applied after it returns, in their order.
type Resender interface {
	Resend(streamID int64, names map[string][]string)
}

// Hooks are told what the scheduler does, for metrics. Any may be nil.
type Hooks struct {
	// PolicyCall reports one decision: how long the policy (fallback included) took, and the
	// error when no policy answered.
	PolicyCall func(zone string, latency time.Duration, err error)
	// Round reports a fired round: the delay it waited and the resources resent per kind.
	Round func(zone string, delay time.Duration, resent map[string]int)
	// Decided reports each policy answer a stream acted on (for the DEBUG log).
	Decided func(zone string, d Decision)
	// GaveUp reports a give-up.
	GaveUp func(zone, reason string)
	// Parked reports names the policy parks until their content changes.
	Parked func(zone string, parked []ParkedName)
	// Released reports names resent at once, by kind, because the owner they missed arrived.
	Released func(zone string, resent map[string]int)
}

// Config is a Scheduler's collaborators.
type Config struct {
	// Policy decides every round; Standard composes the host's (deadline, checks, fallback).
	// It must return within a bounded time.
	Policy   shared.RetryForcer
	Resender Resender
	Hooks    Hooks
}

// Scheduler drives one Machine per zone stream: it feeds them the stream events, calls the
// policy off the stream's goroutine, owns each stream's one timer, and resends what a round
// names. State lives in the Machines, never in a policy, so a policy that crashes or is swapped
// loses nothing.
type Scheduler struct {
	cfg Config

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // decisions in flight

	mu      sync.Mutex
	streams map[int64]*driven
	peak    shrink.Peak
}

// driven is one stream's Machine and the timer it asked for.
type driven struct {
	zone  string
	m     *Machine
	timer *time.Timer
	// busy: a goroutine is stepping the stream (step); the transitions that arrive meanwhile
	// wait in pending, in order, and that goroutine runs them.
	busy    bool
	pending []func(m *Machine) Ready
}

// NewScheduler returns a scheduler; Close stops its timers and waits for its decisions.
func NewScheduler(cfg Config) (*Scheduler, error) {
	if cfg.Policy == nil || cfg.Resender == nil {
		return nil, errors.New("retry: Policy and Resender are required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{cfg: cfg, ctx: ctx, cancel: cancel, streams: map[int64]*driven{}}, nil
}

// Observer is how the scheduler hears of stream events. Each returns at once.
func (s *Scheduler) Observer() event.Observer {
	return event.Observer{
		StreamOpened: func(id int64, zone string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.streams[id] = &driven{zone: zone, m: NewMachine(id, zone)}
		},
		Sent: func(e event.Sent) { s.step(e.StreamID, func(m *Machine) Ready { return m.Sent(e, time.Now()) }) },
		ACK:  func(a event.ACK) { s.step(a.StreamID, func(m *Machine) Ready { return m.ACK(a, time.Now()) }) },
		NACK: func(n event.NACK) { s.step(n.StreamID, func(m *Machine) Ready { return m.NACK(n, time.Now()) }) },
		StreamClosed: func(id int64, _ string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if d := s.streams[id]; d != nil {
				d.stopTimer()
				delete(s.streams, id)
				s.streams = shrink.Map(s.streams, &s.peak)
			}
		},
	}
}

// Close stops every timer, cancels the decisions in flight and waits for them; each returns
// at once on cancel, whatever its policy does.
func (s *Scheduler) Close() {
	s.cancel()
	s.mu.Lock()
	for id, d := range s.streams {
		d.stopTimer()
		delete(s.streams, id)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (d *driven) stopTimer() {
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
}

// step runs one transition of a stream's Machine and carries out what it asks.
//
// A stream's transitions and the resends they ask for happen in one order: the goroutine that
// steps a stream keeps it (busy) until it has carried out what the Machine asked, resend
// included, and then runs the transitions that arrived meanwhile, in their order. So an event
// never overtakes a resend decided before it (an ACK applied between a round and its resend
// would see the round's names forced again after the zone stored them), and the xDS callbacks
// never wait for a resend: theirs is queued, and they return.
func (s *Scheduler) step(id int64, transition func(m *Machine) Ready) {
	s.mu.Lock()
	d := s.streams[id]
	if d == nil || s.ctx.Err() != nil {
		s.mu.Unlock()
		return
	}
	if d.busy {
		d.pending = append(d.pending, transition)
		s.mu.Unlock()
		return
	}
	d.busy = true
	for {
		r := s.transitionLocked(id, d, transition)
		s.mu.Unlock()
		// Outside the lock: the resender takes the cache's, and hooks are the caller's code.
		// Both may step this stream again: that step waits in pending.
		s.carryOut(id, d.zone, r)
		s.mu.Lock()
		if len(d.pending) == 0 || s.streams[id] != d || s.ctx.Err() != nil {
			d.busy, d.pending = false, nil
			s.mu.Unlock()
			return
		}
		transition = d.pending[0]
		d.pending[0] = nil
		d.pending = d.pending[1:]
	}
}

// transitionLocked runs one transition and starts the timer and the decision it asks for.
func (s *Scheduler) transitionLocked(id int64, d *driven, transition func(m *Machine) Ready) Ready {
	r := transition(d.m)
	if r.Disarm {
		d.stopTimer()
	}
	if r.Arm > 0 {
		d.stopTimer()
		token := r.Token
		d.timer = time.AfterFunc(r.Arm, func() {
			s.step(id, func(m *Machine) Ready { return m.Fired(token, time.Now()) })
		})
	}
	if r.Ask != nil {
		s.wg.Add(1)
		go s.decide(id, d.zone, r)
	}
	return r
}

// carryOut reports a transition to the hooks and makes the resend it asks for.
func (s *Scheduler) carryOut(id int64, zone string, r Ready) {
	if r.Round != nil && s.cfg.Hooks.Round != nil {
		s.cfg.Hooks.Round(zone, r.Round.Delay, r.Round.Resent)
	}
	if r.Decision != nil && s.cfg.Hooks.Decided != nil {
		s.cfg.Hooks.Decided(zone, *r.Decision)
	}
	if r.GaveUp != "" && s.cfg.Hooks.GaveUp != nil {
		s.cfg.Hooks.GaveUp(zone, r.GaveUp)
	}
	if len(r.Parked) > 0 && s.cfg.Hooks.Parked != nil {
		s.cfg.Hooks.Parked(zone, r.Parked)
	}
	if len(r.Released) > 0 && s.cfg.Hooks.Released != nil {
		s.cfg.Hooks.Released(zone, r.Released)
	}
	if len(r.Resend) > 0 {
		s.cfg.Resender.Resend(id, r.Resend)
	}
}

// decide asks the policy for the schedule a Machine asked for, and hands it the answer.
func (s *Scheduler) decide(id int64, zone string, r Ready) {
	defer s.wg.Done()
	start := time.Now()
	resp, err := s.cfg.Policy.Schedule(s.ctx, r.Ask)
	if s.cfg.Hooks.PolicyCall != nil {
		s.cfg.Hooks.PolicyCall(zone, time.Since(start), err)
	}
	s.step(id, func(m *Machine) Ready { return m.Decided(r.Token, resp, err, time.Now()) })
}

// State returns the retry state of every stream.
func (s *Scheduler) State() []StreamState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StreamState, 0, len(s.streams))
	for _, d := range s.streams {
		out = append(out, d.m.State())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}

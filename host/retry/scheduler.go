// Package retry sends again, on a backoff schedule, what zones rejected: stream-level rounds
// decided by a RetryForcer policy off the stream's goroutine, applied by one timer per stream.
// The xDS callbacks only record; nothing here ever blocks a stream.
package retry

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kds-host/kds-host/host/kds"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Resender makes a stream send named resources again (kds.Cache.Resend).
type Resender interface {
	Resend(streamID int64, names map[string][]string)
}

// Hooks are told what the scheduler decides, for metrics. Any may be nil.
type Hooks struct {
	// PolicyCall reports one policy call: its latency and whether the fallback answered.
	PolicyCall func(zone string, latency time.Duration, fallback bool, err error)
	// Round reports a fired round: the delay it waited and the resources resent per kind.
	Round func(zone string, delay time.Duration, resent map[string]int)
	// GaveUp reports a give-up.
	GaveUp func(zone, reason string)
}

// Config is a Scheduler's collaborators.
type Config struct {
	// Policy returns the policy in force now (a plugin, or the built-in one); it is called for
	// every decision, so a swap takes effect at the next one.
	Policy func() shared.RetryForcer
	// Fallback answers when Policy errs or misses its deadline: the built-in policy.
	Fallback shared.RetryForcer
	// Timeout is the deadline of a policy call (default 200ms).
	Timeout  time.Duration
	Resender Resender
	Hooks    Hooks
}

// Scheduler is the kds.Observer that keeps, per stream, the kinds the zone rejected and runs
// the retry rounds. State lives here, never in a policy, so a policy that crashes or is swapped
// loses nothing.
type Scheduler struct {
	cfg Config

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // policy calls in flight

	mu      sync.Mutex
	streams map[int64]*stream
}

// stream is one zone stream's retry state.
type stream struct {
	id      int64
	zone    string
	failing map[string]*failingKind
	round   uint32
	last    time.Duration // delay of the previous round
	epoch   uint64        // bumped when a pending decision must be dropped
	pending bool          // a policy call or a timer is outstanding
	timer   *time.Timer
	nextAt  time.Time
	givenUp string // reason, when the policy gave up
}

// failingKind is one kind with names the zone refused and has not accepted since.
type failingKind struct {
	rejected  map[string]string // name -> refused version
	detail    string
	nacks     uint32
	firstNACK time.Time
}

// NewScheduler returns a scheduler; Close stops its timers and waits for its policy calls.
func NewScheduler(cfg Config) (*Scheduler, error) {
	if cfg.Policy == nil || cfg.Fallback == nil || cfg.Resender == nil {
		return nil, errors.New("retry: Policy, Fallback and Resender are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 200 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{cfg: cfg, ctx: ctx, cancel: cancel, streams: map[int64]*stream{}}, nil
}

// Close stops every timer and waits for the policy calls in flight.
func (s *Scheduler) Close() {
	s.cancel()
	s.mu.Lock()
	for id, st := range s.streams {
		st.stop()
		delete(s.streams, id)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (st *stream) stop() {
	st.epoch++
	st.pending = false
	st.nextAt = time.Time{}
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// StreamOpened implements kds.Observer.
func (s *Scheduler) StreamOpened(id int64, zone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[id] = &stream{id: id, zone: zone, failing: map[string]*failingKind{}}
}

// StreamClosed implements kds.Observer: all state of the stream is freed.
func (s *Scheduler) StreamClosed(id int64, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[id]; st != nil {
		st.stop()
		delete(s.streams, id)
	}
}

// Sent implements kds.Observer. A rejected name sent again with another version changed
// content: it is no longer the refused version, and a give-up no longer holds. A removed name
// is no longer anything to resend.
func (s *Scheduler) Sent(id int64, _, kind string, versions map[string]string, removed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return
	}
	fk := st.failing[kind]
	if fk == nil {
		return
	}
	for name, v := range versions {
		if old, ok := fk.rejected[name]; ok && old != v {
			delete(fk.rejected, name)
			if st.givenUp != "" {
				st.givenUp = ""
				st.round, st.last = 0, 0
			}
		}
	}
	for _, name := range removed {
		delete(fk.rejected, name)
	}
	st.forget(kind)
}

// Acked implements kds.Observer: the names of the response are accepted.
func (s *Scheduler) Acked(a kds.ACK) {
	if a.Initial {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[a.StreamID]
	if st == nil {
		return
	}
	if fk := st.failing[a.Kind]; fk != nil {
		for name := range a.Versions {
			delete(fk.rejected, name)
		}
		st.forget(a.Kind)
	}
}

// forget drops a kind with no rejected name left; with nothing failing, the stream starts over.
func (st *stream) forget(kind string) {
	if fk := st.failing[kind]; fk != nil && len(fk.rejected) == 0 {
		delete(st.failing, kind)
	}
	if len(st.failing) == 0 {
		st.stop()
		st.round, st.last, st.givenUp = 0, 0, ""
	}
}

// Nacked implements kds.Observer: it records the rejection and, when no round is pending, asks
// the policy for one off the stream's goroutine. It returns at once.
func (s *Scheduler) Nacked(n kds.NACK) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[n.StreamID]
	if st == nil {
		return
	}
	fk := st.failing[n.Kind]
	if fk == nil {
		fk = &failingKind{rejected: map[string]string{}, firstNACK: time.Now()}
		st.failing[n.Kind] = fk
	}
	for name := range n.Accepted {
		delete(fk.rejected, name)
	}
	for _, r := range n.Rejected {
		fk.rejected[r.Name] = r.Version
	}
	fk.nacks++
	fk.detail = n.Detail
	st.forget(n.Kind)
	if len(st.failing) == 0 || st.pending || st.givenUp != "" {
		return // nothing left, or it joins the pending round, or the policy gave up
	}
	s.askLocked(st)
}

// askLocked starts a policy call for the stream's next round.
func (s *Scheduler) askLocked(st *stream) {
	st.pending = true
	epoch := st.epoch
	req := st.scheduleRequest()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		resp := s.decide(st.zone, req)
		s.apply(st.id, epoch, resp)
	}()
}

func (st *stream) scheduleRequest() *pluginv1.ScheduleRequest {
	req := &pluginv1.ScheduleRequest{
		StreamId: strconv.FormatInt(st.id, 10), Zone: st.zone,
		Round: st.round, LastDelay: durationpb.New(st.last),
	}
	for _, kind := range sortedKinds(st.failing) {
		fk := st.failing[kind]
		names := make([]string, 0, len(fk.rejected))
		for n := range fk.rejected {
			names = append(names, n)
		}
		sort.Strings(names)
		req.Failing = append(req.Failing, &pluginv1.FailingKind{
			Kind: kind, RejectedNames: names, ErrorDetail: fk.detail,
			NackCount: fk.nacks, FirstNack: timestamppb.New(fk.firstNACK),
		})
	}
	return req
}

// decide asks the policy, with a deadline, and the fallback when the policy fails.
func (s *Scheduler) decide(zone string, req *pluginv1.ScheduleRequest) *pluginv1.ScheduleResponse {
	start := time.Now()
	resp, err := s.call(s.cfg.Policy(), req)
	if err == nil {
		s.hookCall(zone, time.Since(start), false, nil)
		return resp
	}
	fresp, ferr := s.call(s.cfg.Fallback, req)
	s.hookCall(zone, time.Since(start), true, err)
	if ferr != nil {
		// Even the built-in policy failed: retry in a second rather than never.
		return &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second), Reason: "fallback failed: " + ferr.Error()}
	}
	return fresp
}

// call runs one Schedule call and returns by the deadline, even if the policy ignores its
// context (the call then finishes in the background and its answer is dropped).
func (s *Scheduler) call(p shared.RetryForcer, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
	defer cancel()
	type result struct {
		resp *pluginv1.ScheduleResponse
		err  error
	}
	done := make(chan result, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		resp, err := p.Schedule(ctx, req)
		if err == nil {
			err = validResponse(resp)
		}
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("retry policy: %w", ctx.Err())
	}
}

func (s *Scheduler) hookCall(zone string, d time.Duration, fallback bool, err error) {
	if s.cfg.Hooks.PolicyCall != nil {
		s.cfg.Hooks.PolicyCall(zone, d, fallback, err)
	}
}

// validResponse rejects answers a host must not act on.
func validResponse(r *pluginv1.ScheduleResponse) error {
	switch {
	case r == nil:
		return errors.New("empty schedule")
	case r.GetGiveUp():
		return nil
	case r.GetDelay() == nil || r.GetDelay().AsDuration() <= 0:
		return fmt.Errorf("schedule delay %v is not positive", r.GetDelay().AsDuration())
	case r.GetDelay().AsDuration() > time.Hour:
		return fmt.Errorf("schedule delay %v is over an hour", r.GetDelay().AsDuration())
	}
	return nil
}

// apply sets the stream's timer from a decision, unless the stream moved on meanwhile.
func (s *Scheduler) apply(id int64, epoch uint64, resp *pluginv1.ScheduleResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil || st.epoch != epoch {
		return
	}
	if resp.GetGiveUp() {
		st.pending = false
		st.givenUp = resp.GetReason()
		if st.givenUp == "" {
			st.givenUp = "the policy gave up"
		}
		if s.cfg.Hooks.GaveUp != nil {
			s.cfg.Hooks.GaveUp(st.zone, st.givenUp)
		}
		return
	}
	delay := resp.GetDelay().AsDuration()
	kinds := resp.GetKinds()
	st.nextAt = time.Now().Add(delay)
	st.timer = time.AfterFunc(delay, func() { s.fire(id, epoch, delay, kinds) })
}

// fire runs a round: the rejected names of the scheduled kinds (every failing kind when the
// schedule names none) are sent again, all at once.
func (s *Scheduler) fire(id int64, epoch uint64, delay time.Duration, kinds []string) {
	s.mu.Lock()
	st := s.streams[id]
	if st == nil || st.epoch != epoch {
		s.mu.Unlock()
		return
	}
	st.timer, st.pending, st.nextAt = nil, false, time.Time{}
	st.round++
	st.last = delay
	if len(kinds) == 0 {
		kinds = sortedKinds(st.failing)
	}
	names := map[string][]string{}
	counts := map[string]int{}
	for _, kind := range kinds {
		fk := st.failing[kind]
		if fk == nil {
			continue
		}
		for n := range fk.rejected {
			names[kind] = append(names[kind], n)
		}
		counts[kind] = len(names[kind])
	}
	// A kind that failed after the schedule was made, and was left out of it, gets its own.
	if len(names) < len(st.failing) && st.givenUp == "" {
		s.askLocked(st)
	}
	zone := st.zone
	s.mu.Unlock()
	if s.cfg.Hooks.Round != nil {
		s.cfg.Hooks.Round(zone, delay, counts)
	}
	s.cfg.Resender.Resend(id, names)
}

func sortedKinds(m map[string]*failingKind) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// KindState is the retry state of one failing kind of a stream.
type KindState struct {
	Kind      string    `json:"kind"`
	Rejected  []string  `json:"rejected"`
	NACKs     uint32    `json:"nacks"`
	FirstNACK time.Time `json:"firstNack"`
}

// StreamState is the retry state of one stream, for insights.
type StreamState struct {
	Stream    int64       `json:"stream"`
	Zone      string      `json:"zone"`
	Round     uint32      `json:"round"`
	LastDelay string      `json:"lastDelay,omitempty"`
	NextRetry *time.Time  `json:"nextRetry,omitempty"`
	GivenUp   string      `json:"givenUp,omitempty"`
	Failing   []KindState `json:"failing,omitempty"`
}

// State returns the retry state of every stream.
func (s *Scheduler) State() []StreamState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StreamState, 0, len(s.streams))
	for _, st := range s.streams {
		ss := StreamState{Stream: st.id, Zone: st.zone, Round: st.round, GivenUp: st.givenUp}
		if st.last > 0 {
			ss.LastDelay = st.last.String()
		}
		if !st.nextAt.IsZero() {
			t := st.nextAt
			ss.NextRetry = &t
		}
		for _, kind := range sortedKinds(st.failing) {
			fk := st.failing[kind]
			ks := KindState{Kind: kind, NACKs: fk.nacks, FirstNACK: fk.firstNACK}
			for n := range fk.rejected {
				ks.Rejected = append(ks.Rejected, n)
			}
			sort.Strings(ks.Rejected)
			ss.Failing = append(ss.Failing, ks)
		}
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}

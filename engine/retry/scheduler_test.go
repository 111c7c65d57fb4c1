package retry_test

import (
	"context"
	"runtime"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/serial"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// policy is a RetryForcer test double: delay = base * 2^round, optional give-up and hang.
type policy struct {
	base     time.Duration
	giveUpAt uint32 // 0: never
	hang     bool

	mu    sync.Mutex
	calls []*pluginv1.ScheduleRequest
}

func (p *policy) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "test"}, nil
}

func (p *policy) Configure(context.Context, *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{}, nil
}

func (p *policy) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	p.mu.Lock()
	p.calls = append(p.calls, req)
	p.mu.Unlock()
	if p.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if p.giveUpAt > 0 && req.GetRound() >= p.giveUpAt {
		return &pluginv1.ScheduleResponse{GiveUp: true, Reason: "max attempts reached"}, nil
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(p.base << req.GetRound())}, nil
}

func (p *policy) Calls() []*pluginv1.ScheduleRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*pluginv1.ScheduleRequest(nil), p.calls...)
}

// resender records rounds, and can answer each with a NACK, as a client that keeps failing.
type resender struct {
	mu     sync.Mutex
	rounds []map[string][]string
	at     []time.Time
	onSend func(names map[string][]string)
}

func (r *resender) Resend(_ int64, names map[string][]string) {
	r.mu.Lock()
	for _, ns := range names {
		sort.Strings(ns)
	}
	r.rounds = append(r.rounds, names)
	r.at = append(r.at, time.Now())
	f := r.onSend
	r.mu.Unlock()
	if f != nil {
		f(names)
	}
}

func (r *resender) Rounds() []map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string][]string(nil), r.rounds...)
}

// session is a stream's session as the engine's Session is to the scheduler: a work queue, the
// retry state, and the resend (recorded by r).
type session struct {
	serial.Queue
	id    int64
	retry retry.Stream
	r     *resender
}

func (s *session) Retry() *retry.Stream             { return &s.retry }
func (s *session) Resend(names map[string][]string) { s.r.Resend(s.id, names) }

// sessions is the registry of open sessions, as the engine's cache keeps it.
type sessions struct {
	mu   sync.Mutex
	open map[int64]*session
	r    *resender
}

func (ss *sessions) get(id int64) retry.Session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.open[id]; s != nil {
		return s
	}
	return nil
}

// sched is a Scheduler with its observer and sessions at hand: s.NACK(n) is what the tracker
// calls, s.StreamOpened opens the stream's session first and s.StreamClosed closes it, as the
// cache does.
type sched struct {
	*retry.Scheduler
	event.Observer
	ss *sessions
}

func (s *sched) StreamOpened(id int64, node string) {
	s.ss.mu.Lock()
	s.ss.open[id] = &session{id: id, r: s.ss.r}
	s.ss.mu.Unlock()
	s.Observer.StreamOpened(id, node)
}

func (s *sched) StreamClosed(id int64, _ string) {
	s.ss.mu.Lock()
	sess := s.ss.open[id]
	delete(s.ss.open, id)
	s.ss.mu.Unlock()
	if sess != nil {
		sess.retry.Close()
	}
}

// State is the retry state of every open stream, by stream.
func (s *sched) State() []retry.StreamState {
	s.ss.mu.Lock()
	defer s.ss.mu.Unlock()
	var out []retry.StreamState
	for _, sess := range s.ss.open {
		if st := sess.retry.State(); st != nil {
			out = append(out, *st)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out
}

// newScheduler runs p with the host's standard decorators (deadline 200ms, fallback).
func newScheduler(t *testing.T, p, fallback shared.RetryForcer, r *resender, hooks retry.Hooks) *sched {
	t.Helper()
	return newSchedulerFallback(t, p, fallback, r, hooks, nil)
}

func newSchedulerFallback(t *testing.T, p, fallback shared.RetryForcer, r *resender, hooks retry.Hooks, onFallback func(*pluginv1.ScheduleRequest, error)) *sched {
	t.Helper()
	policy := retry.Standard(func() shared.RetryForcer { return p }, fallback, retry.StandardConfig{OnFallback: onFallback})
	ss := &sessions{open: map[int64]*session{}, r: r}
	s, err := retry.NewScheduler(retry.Config{Policy: policy, Sessions: ss.get, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &sched{s, s.Observer(), ss}
}

func nack(typeURL string, names ...string) event.NACK {
	n := event.NACK{StreamID: 1, Node: "node-1", TypeURL: typeURL, Detail: "rejected"}
	for _, name := range names {
		n.Rejected = append(n.Rejected, event.Rejection{Name: name, Version: "v1"})
	}
	return n
}

func TestThreeTypesNACKedWithinOneRoundAreResentInOneRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &policy{base: time.Second}
		r := &resender{}
		s := newScheduler(t, p, &policy{base: time.Hour}, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		start := time.Now()

		s.NACK(nack("Mesh", "default"))
		synctest.Wait()
		time.Sleep(300 * time.Millisecond)
		s.NACK(nack("MeshTimeout", "default/a", "default/b"))
		s.NACK(nack("MeshRetry", "default/r"))
		time.Sleep(time.Second)
		synctest.Wait()

		g.Expect(p.Calls()).To(HaveLen(1), "NACKs during a pending round join it")
		g.Expect(r.Rounds()).To(Equal([]map[string][]string{{
			"Mesh": {"default"}, "MeshTimeout": {"default/a", "default/b"}, "MeshRetry": {"default/r"},
		}}))
		g.Expect(r.at[0].Sub(start)).To(Equal(time.Second))
	})
}

func TestBackoffGrowsAcrossRoundsAndAnACKResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &policy{base: 100 * time.Millisecond}
		r := &resender{}
		s := newScheduler(t, p, &policy{base: time.Hour}, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		r.onSend = func(map[string][]string) { s.NACK(nack("Mesh", "default")) } // keeps failing
		s.NACK(nack("Mesh", "default"))
		time.Sleep(100*time.Millisecond + 200*time.Millisecond + 400*time.Millisecond)
		synctest.Wait()
		g.Expect(r.Rounds()).To(HaveLen(3))
		g.Expect(r.at[1].Sub(r.at[0])).To(Equal(200 * time.Millisecond))
		g.Expect(r.at[2].Sub(r.at[1])).To(Equal(400 * time.Millisecond))
		g.Expect(s.State()[0].Round).To(Equal(uint32(3)))

		// The client accepts: the type leaves the failing set, the round resets, no timer remains.
		r.onSend = nil
		s.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: "Mesh", Versions: event.VersionsOf(map[string]string{"default": "v1"})})
		st := s.State()[0]
		g.Expect(st.Round).To(BeZero())
		g.Expect(st.Failing).To(BeEmpty())
		g.Expect(st.NextRetry).To(BeNil())
		time.Sleep(time.Hour)
		g.Expect(r.Rounds()).To(HaveLen(3))

		// A later NACK starts again from round 0.
		s.NACK(nack("Mesh", "default"))
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		g.Expect(r.Rounds()).To(HaveLen(4))
		g.Expect(p.Calls()[len(p.Calls())-1].GetRound()).To(BeZero())
	})
}

func TestGiveUpStopsResendsUntilContentChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &policy{base: time.Second, giveUpAt: 2}
		r := &resender{}
		var gaveUp []string
		s := newScheduler(t, p, &policy{base: time.Hour}, r, retry.Hooks{GaveUp: func(_, reason string) { gaveUp = append(gaveUp, reason) }})
		s.StreamOpened(1, "node-1")
		r.onSend = func(map[string][]string) { s.NACK(nack("MeshTimeout", "default/a")) }
		s.NACK(nack("MeshTimeout", "default/a"))
		time.Sleep(time.Hour)
		synctest.Wait()
		g.Expect(r.Rounds()).To(HaveLen(2))
		g.Expect(gaveUp).To(Equal([]string{"max attempts reached"}))
		g.Expect(s.State()[0].GivenUp).To(Equal("max attempts reached"))

		// Another NACK of the same content does not restart rounds.
		s.NACK(nack("MeshTimeout", "default/a"))
		time.Sleep(time.Hour)
		g.Expect(r.Rounds()).To(HaveLen(2))

		// New content is sent (by the cache, at once); the give-up is lifted, and its NACK
		// starts a new round from 0.
		s.Sent(event.Sent{StreamID: 1, Node: "node-1", TypeURL: "MeshTimeout", Versions: event.VersionsOf(map[string]string{"default/a": "v2"})})
		g.Expect(s.State()[0].GivenUp).To(BeEmpty())
		s.NACK(nack("MeshTimeout", "default/a"))
		time.Sleep(time.Second)
		synctest.Wait()
		g.Expect(r.Rounds()).To(HaveLen(3))
	})
}

func TestClosingAStreamFreesItsState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		s := newScheduler(t, &policy{base: time.Second}, &policy{base: time.Hour}, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		s.NACK(nack("Mesh", "default"))
		synctest.Wait()
		g.Expect(s.State()).To(HaveLen(1))
		s.StreamClosed(1, "node-1")
		g.Expect(s.State()).To(BeEmpty())
		time.Sleep(time.Hour)
		g.Expect(r.Rounds()).To(BeEmpty(), "the pending timer was stopped")
	})
}

func TestAPolicyThatNeverAnswersFallsBackAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		type call struct {
			latency  time.Duration
			fallback bool
		}
		var calls []call
		var mu sync.Mutex
		fellBack := false
		hooks := retry.Hooks{PolicyCall: func(_ string, d time.Duration, err error) {
			mu.Lock()
			calls = append(calls, call{d, fellBack})
			mu.Unlock()
			g.Expect(err).NotTo(HaveOccurred(), "the fallback answered")
		}}
		s := newSchedulerFallback(t, &policy{hang: true}, &policy{base: 50 * time.Millisecond}, r, hooks,
			func(*pluginv1.ScheduleRequest, error) { fellBack = true })
		s.StreamOpened(1, "node-1")
		start := time.Now()
		s.NACK(nack("Mesh", "default")) // returns at once, whatever the policy does
		g.Expect(time.Since(start)).To(BeZero())
		time.Sleep(time.Second)
		synctest.Wait()
		g.Expect(calls).To(Equal([]call{{200 * time.Millisecond, true}}))
		g.Expect(r.Rounds()).To(HaveLen(1))
		g.Expect(r.at[0].Sub(start)).To(Equal(250*time.Millisecond), "deadline 200ms, then the fallback's 50ms")
	})
}

func TestATypeThatFailsAfterTheScheduleStillGetsARound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		p := &explicitTypes{}
		s := newScheduler(t, p, p, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		s.NACK(nack("Mesh", "default"))
		synctest.Wait()
		s.NACK(nack("MeshTimeout", "default/a")) // joins, but the schedule named only Mesh
		time.Sleep(2 * time.Second)
		synctest.Wait()
		g.Expect(r.Rounds()).To(Equal([]map[string][]string{{"Mesh": {"default"}}, {"Mesh": {"default"}, "MeshTimeout": {"default/a"}}}))
	})
}

// explicitTypes names the failing types it saw, with a fixed delay of 1s.
type explicitTypes struct{ policy }

func (e *explicitTypes) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	resp := &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second)}
	for _, f := range req.GetFailing() {
		resp.Kinds = append(resp.Kinds, f.GetKind())
	}
	return resp, nil
}

func TestTenMinutesOfNACKsKeepMemoryBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		s := newScheduler(t, &fixed{d: 100 * time.Millisecond}, &policy{base: time.Hour}, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		names := make([]string, 100)
		for i := range names {
			names[i] = "default/p-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		}
		typeURLs := []string{"Mesh", "MeshTimeout", "MeshRetry", "MeshCircuitBreaker"}
		rounds := 0
		r.onSend = func(map[string][]string) {
			rounds++
			r.mu.Lock()
			r.rounds, r.at = r.rounds[:0], r.at[:0] // the recorder itself must not grow
			r.mu.Unlock()
			for _, k := range typeURLs {
				s.NACK(nack(k, names...))
			}
		}
		for _, k := range typeURLs {
			s.NACK(nack(k, names...))
		}
		heap := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapAlloc
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		before := heap()
		time.Sleep(9 * time.Minute)
		synctest.Wait()
		after := heap()
		g.Expect(rounds).To(BeNumerically(">=", 5999))
		st := s.State()[0]
		g.Expect(st.Failing).To(HaveLen(4))
		for _, f := range st.Failing {
			g.Expect(f.Rejected).To(HaveLen(100))
		}
		g.Expect(int64(after)-int64(before)).To(BeNumerically("<", 256<<10), "heap grew by %d bytes over 5400 rounds", int64(after)-int64(before))
	})
}

type fixed struct {
	policy
	d time.Duration
}

func (f *fixed) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(f.d)}, nil
}

// stubborn ignores its context and answers after 10 s.
type stubborn struct{ policy }

func (s *stubborn) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	time.Sleep(10 * time.Second)
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Millisecond)}, nil
}

func TestAPolicyThatIgnoresItsDeadlineStillFallsBackAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		fallbacks := 0
		s := newSchedulerFallback(t, &stubborn{}, &policy{base: 50 * time.Millisecond}, r, retry.Hooks{},
			func(*pluginv1.ScheduleRequest, error) { fallbacks++ })
		s.StreamOpened(1, "node-1")
		start := time.Now()
		s.NACK(nack("Mesh", "default"))
		time.Sleep(time.Second)
		g.Expect(r.Rounds()).To(HaveLen(1))
		g.Expect(r.at[0].Sub(start)).To(Equal(250 * time.Millisecond))
		g.Expect(fallbacks).To(Equal(1))
		time.Sleep(10 * time.Second) // let the abandoned call finish inside the bubble
	})
}

// Defect 1, through the driver: the give-up is lifted by new content of one type, that type is
// ACKed, and the other failing type must still get its round.
func TestAGiveUpLiftedByNewContentStillRetriesTheOtherTypes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &policy{base: time.Second, giveUpAt: 1}
		r := &resender{}
		s := newScheduler(t, p, &policy{base: time.Hour}, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		s.NACK(nack("Mesh", "default"))
		s.NACK(nack("MeshTimeout", "default/a"))
		time.Sleep(time.Second)
		synctest.Wait()
		g.Expect(r.Rounds()).To(HaveLen(1))
		r.onSend = func(names map[string][]string) { s.NACK(nack("Mesh", "default")) }
		s.NACK(nack("Mesh", "default"))
		s.NACK(nack("MeshTimeout", "default/a"))
		synctest.Wait()
		g.Expect(s.State()[0].GivenUp).To(Equal("max attempts reached"))

		p.giveUpAt = 0
		s.Sent(event.Sent{StreamID: 1, Node: "node-1", TypeURL: "MeshTimeout", Versions: event.VersionsOf(map[string]string{"default/a": "v2"})})
		s.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: "MeshTimeout", Versions: event.VersionsOf(map[string]string{"default/a": "v2"})})
		time.Sleep(time.Minute)
		synctest.Wait()
		g.Expect(len(r.Rounds())).To(BeNumerically(">", 1), "Mesh still fails: it gets rounds again")
		g.Expect(r.Rounds()[1]).To(Equal(map[string][]string{"Mesh": {"default"}}))
	})
}

// ignorant ignores its context and answers only when released.
type ignorant struct {
	policy
	release chan struct{}
}

func (p *ignorant) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	<-p.release
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Millisecond)}, nil
}

// Defect 2: Close waited for a policy call that ignores its context.
func TestCloseDoesNotWaitForAPolicyThatIgnoresItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &ignorant{release: make(chan struct{})}
		defer close(p.release) // lets the abandoned call end inside the bubble
		ss := &sessions{open: map[int64]*session{}, r: &resender{}}
		sch, err := retry.NewScheduler(retry.Config{Policy: retry.WithDeadline(p, time.Hour), Sessions: ss.get})
		g.Expect(err).NotTo(HaveOccurred())
		obs := &sched{sch, sch.Observer(), ss}
		obs.StreamOpened(1, "node-1")
		obs.NACK(nack("Mesh", "default"))
		synctest.Wait()
		start := time.Now()
		sch.Close()
		g.Expect(time.Since(start)).To(BeZero(), "Close returns at once")
	})
}

// Defect 5 of issue 21: a round's resend was made after the scheduler let go of the stream, so
// an ACK of the same names applied in between was overtaken by it: a name the client had just
// ACKed was forced again. A resend now comes in the stream's order: when it is made, the
// stream's Machine still holds every name it resends as rejected.
func TestARoundDoesNotResendANameTheClientACKedBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		var s *sched
		ack := event.ACK{StreamID: 1, Node: "node-1", TypeURL: "Mesh", Versions: event.VersionsOf(map[string]string{"default": "v1"})}
		// The client's ACK of the round's name arrives just as the round fires: the Round hook
		// runs on the round's goroutine, between the round and its resend.
		hooks := retry.Hooks{Round: func(string, time.Duration, map[string]int) { s.ACK(ack) }}
		s = newScheduler(t, &policy{base: time.Second}, &policy{base: time.Hour}, r, hooks)
		var stale []string
		r.onSend = func(names map[string][]string) {
			rejected := map[string]bool{}
			for _, st := range s.State() {
				for _, f := range st.Failing {
					for _, n := range f.Rejected {
						rejected[f.TypeURL+"/"+n] = true
					}
				}
			}
			for typeURL, ns := range names {
				for _, n := range ns {
					if !rejected[typeURL+"/"+n] {
						stale = append(stale, typeURL+"/"+n)
					}
				}
			}
		}
		s.StreamOpened(1, "node-1")
		s.NACK(nack("Mesh", "default"))
		time.Sleep(time.Second)
		synctest.Wait()

		g.Expect(r.Rounds()).To(HaveLen(1))
		g.Expect(stale).To(BeEmpty(), "resent after the scheduler applied their ACK")
		st := s.State()[0]
		g.Expect(st.Failing).To(BeEmpty(), "the ACK is applied, after the resend")
		g.Expect(st.NextRetry).To(BeNil())
		time.Sleep(time.Hour)
		g.Expect(r.Rounds()).To(HaveLen(1))
	})
}

// While a stream's resend is being made, its events wait in order behind it, not in the xDS
// callback that brought them; and one is applied as it was when its callback returned (the
// callback copies the versions, which the stream reads in place and reuses after the call).
func TestAnEventDuringAResendIsQueuedBehindItAndItsCallbackReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		r := &resender{}
		release := make(chan struct{})
		r.onSend = func(map[string][]string) { <-release } // a resend that takes its time
		done := sync.OnceFunc(func() { close(release) })
		defer done()
		s := newScheduler(t, &policy{base: time.Second}, &policy{base: time.Hour}, r, retry.Hooks{})
		s.StreamOpened(1, "node-1")
		s.NACK(nack("Mesh", "default"))
		time.Sleep(time.Second)
		synctest.Wait()
		g.Expect(r.Rounds()).To(HaveLen(1), "the round's goroutine is in Resend")

		carried := map[string]string{"default": "v1"} // the response, read in place
		s.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: "Mesh", Versions: event.VersionsOf(carried)})
		clear(carried) // the stream reuses what the view read
		g.Expect(s.State()[0].Failing).To(HaveLen(1), "the ACK waits for the resend decided before it")
		done()
		synctest.Wait()
		g.Expect(s.State()[0].Failing).To(BeEmpty(), "then it is applied, as the callback was given it")
		time.Sleep(time.Hour)
		g.Expect(r.Rounds()).To(HaveLen(1))
	})
}

// Close while a stream's NACK is starting a decision: the decision either starts before Close
// waits for it or never starts. Under -race, a decision counted after Close began waiting
// (WaitGroup.Add racing Wait, seen in the guard's tests) is reported; the interleaving is rare,
// so the test tries it 500 times (without the fix, about one run in six reports it).
func TestCloseRacesANACKThatAsksForADecision(t *testing.T) {
	for range 500 {
		ss := &sessions{open: map[int64]*session{}, r: &resender{}}
		sch, err := retry.NewScheduler(retry.Config{Policy: &policy{base: time.Second}, Sessions: ss.get})
		if err != nil {
			t.Fatal(err)
		}
		obs := &sched{sch, sch.Observer(), ss}
		obs.StreamOpened(1, "node-1")
		done := make(chan struct{})
		go func() {
			defer close(done)
			obs.NACK(nack("Mesh", "default"))
		}()
		sch.Close()
		<-done
	}
}

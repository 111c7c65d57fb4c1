package policy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"log/slog"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// fakeProcess is a process that exits when told.
type fakeProcess struct {
	exited atomic.Bool
	kills  atomic.Int32
}

func (p *fakeProcess) Exited() bool { return p.exited.Load() }
func (p *fakeProcess) Kill() error  { p.kills.Add(1); p.exited.Store(true); return nil }
func (p *fakeProcess) Stderr() string {
	return ""
}

// fakeForcer answers Schedule with its delay, or hangs until the deadline while hang is set.
type fakeForcer struct {
	delay time.Duration
	hang  atomic.Bool
	calls atomic.Int32
}

func (f *fakeForcer) wait(ctx context.Context) error {
	f.calls.Add(1)
	if f.hang.Load() {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return nil
}

func (f *fakeForcer) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "fake"}, f.wait(ctx)
}

func (f *fakeForcer) Configure(ctx context.Context, _ *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{}, f.wait(ctx)
}

func (f *fakeForcer) Schedule(ctx context.Context, _ *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(f.delay)}, nil
}

// fakePlugin starts fake instances and records when, failing while failing > 0.
type fakePlugin struct {
	mu       sync.Mutex
	starts   []time.Time
	failing  int
	forcers  []*fakeForcer
	procs    []*fakeProcess
	crashing int // how many of the next processes start already exited
}

func (p *fakePlugin) start(context.Context) (*instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts = append(p.starts, time.Now())
	if p.failing > 0 {
		p.failing--
		return nil, errors.New("no luck")
	}
	proc, rf := &fakeProcess{}, &fakeForcer{delay: time.Duration(len(p.procs)+1) * time.Second}
	if p.crashing > 0 {
		p.crashing--
		proc.exited.Store(true)
	}
	p.procs, p.forcers = append(p.procs, proc), append(p.forcers, rf)
	inst := newInstance(proc, 100+len(p.procs))
	inst.rf, inst.name = rf, "fake"
	return inst, nil
}

// gaps returns the time between consecutive starts.
func (p *fakePlugin) gaps() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(p.starts); i++ {
		out = append(out, p.starts[i].Sub(p.starts[i-1]))
	}
	return out
}

func (p *fakePlugin) proc(i int) *fakeProcess {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.procs[i]
}

func (p *fakePlugin) forcer(i int) *fakeForcer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forcers[i]
}

// supervise starts a supervisor over a fakePlugin's first instance.
func supervise(t *testing.T, p *fakePlugin, mutate func(*Options)) *supervisor {
	t.Helper()
	cfg := Options{ProbeInterval: time.Hour}
	if mutate != nil {
		mutate(&cfg)
	}
	cfg.setDefaults()
	first, err := p.start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := newSupervisor(Spec{Path: "fake"}, first, p.start, &cfg, slog.New(slog.DiscardHandler), newMetrics(Metrics{}, func() []Status { return nil }))
	s.begin()
	t.Cleanup(s.stop)
	return s
}

func scheduleVia(s *supervisor) (time.Duration, error) {
	var resp *pluginv1.ScheduleResponse
	err := s.call(context.Background(), "Schedule", func(ctx context.Context, i *instance) error {
		var err error
		resp, err = i.rf.Schedule(ctx, &pluginv1.ScheduleRequest{})
		return err
	})
	return resp.GetDelay().AsDuration(), err
}

func TestAnExitedPluginIsRestartedWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &fakePlugin{}
		s := supervise(t, p, nil)

		// It exits after a stable run, half a poll before a poll: noticed at that poll, and
		// restarted after BackoffMin. (The fake clock makes every gap exact; exiting between
		// polls keeps the exit and the poll from falling on the same instant.)
		time.Sleep(time.Minute + exitPoll/2)
		p.proc(0).exited.Store(true)
		time.Sleep(time.Second)
		g.Expect(p.gaps()).To(HaveLen(1))
		g.Expect(p.gaps()[0]).To(Equal(time.Minute + exitPoll + 100*time.Millisecond))
		g.Expect(s.status().Restarts).To(Equal(1))
		g.Expect(s.status().PID).To(Equal(102))

		// After another stable run it exits and then keeps failing to start: 100ms, 200ms,
		// 400ms, ... doubling up to 10s.
		time.Sleep(time.Minute)
		p.mu.Lock()
		p.failing = 9
		p.mu.Unlock()
		p.proc(1).exited.Store(true)
		time.Sleep(time.Minute)
		gaps := p.gaps()
		g.Expect(gaps).To(HaveLen(11))
		g.Expect(gaps[1]).To(Equal(time.Minute+time.Second), "the 1s slept above, then the minute")
		want := []time.Duration{200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000}
		for i, w := range want {
			g.Expect(gaps[i+2]).To(Equal(w*time.Millisecond), "gap %d", i+2)
		}
		st := s.status()
		g.Expect(st.State).To(Equal(StateRunning))
		g.Expect(st.Restarts).To(Equal(2))
		g.Expect(st.LastError).To(Equal("no luck"))

		// It ran stably again, so its next exit restarts it after 100ms; that process crashes
		// at once, and the next start waits 200ms.
		p.mu.Lock()
		p.crashing = 1
		p.mu.Unlock()
		p.proc(2).exited.Store(true)
		time.Sleep(time.Second)
		g.Expect(p.gaps()).To(HaveLen(13))
		g.Expect(p.gaps()[12]).To(Equal(200 * time.Millisecond))
		g.Expect(s.status().State).To(Equal(StateRunning))
	})
}

func TestCallsNeverWaitForADownPlugin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &fakePlugin{}
		s := supervise(t, p, func(c *Options) { c.BackoffMin = time.Second })
		d, err := scheduleVia(s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(d).To(Equal(time.Second))

		p.proc(0).exited.Store(true)
		time.Sleep(exitPoll)
		synctest.Wait()
		began := time.Now()
		_, err = scheduleVia(s)
		g.Expect(time.Since(began)).To(BeZero(), "a call while the plugin is down fails at once")
		g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
		var down *downError
		g.Expect(errors.As(err, &down)).To(BeTrue())
		g.Expect(s.status().State).To(Equal(StateRestarting))

		time.Sleep(time.Second + exitPoll)
		d, err = scheduleVia(s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(d).To(Equal(2*time.Second), "the new process answers")
		g.Expect(p.proc(0).kills.Load()).To(BeEquivalentTo(1))
	})
}

func TestAHungPluginIsKilledAndReplaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &fakePlugin{}
		s := supervise(t, p, nil)
		p.forcer(0).hang.Store(true)

		for i := range 2 {
			began := time.Now()
			_, err := scheduleVia(s)
			g.Expect(status.Code(err)).To(Equal(codes.DeadlineExceeded))
			g.Expect(time.Since(began)).To(Equal(200*time.Millisecond), "call %d waits for its deadline only", i)
			g.Expect(s.status().State).To(Equal(StateRunning))
		}
		// A success in between starts the count over.
		p.forcer(0).hang.Store(false)
		_, err := scheduleVia(s)
		g.Expect(err).NotTo(HaveOccurred())
		p.forcer(0).hang.Store(true)
		for range 3 {
			_, err := scheduleVia(s)
			g.Expect(status.Code(err)).To(Equal(codes.DeadlineExceeded))
		}
		st := s.status()
		g.Expect(st.State).To(Equal(StateRestarting))
		g.Expect(st.LastError).To(Equal("hung: 3 calls in a row missed their 200ms deadline"))
		g.Expect(st.Timeouts).To(BeEquivalentTo(5))
		g.Expect(st.Calls).To(BeEquivalentTo(6))

		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		g.Expect(p.proc(0).kills.Load()).To(BeEquivalentTo(1), "the hung process is killed")
		d, err := scheduleVia(s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(d).To(Equal(2 * time.Second))
		g.Expect(s.status().Restarts).To(Equal(1))
	})
}

func TestProbesFindAHungPluginWithoutTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &fakePlugin{}
		s := supervise(t, p, func(c *Options) { c.ProbeInterval = time.Second })
		time.Sleep(10*time.Second + 500*time.Millisecond) // between two probes
		g.Expect(s.status().State).To(Equal(StateRunning))
		g.Expect(s.status().Calls).To(BeZero(), "probes are not calls")

		p.forcer(0).hang.Store(true)
		// Three probes on the 1s ticks, the third timing out 200ms after its tick.
		time.Sleep(2*time.Second + 700*time.Millisecond + time.Millisecond)
		st := s.status()
		g.Expect(st.Restarts).To(Equal(0))
		g.Expect(st.State).To(Equal(StateRestarting))
		time.Sleep(100 * time.Millisecond)
		g.Expect(s.status().State).To(Equal(StateRunning))
		g.Expect(p.proc(0).kills.Load()).To(BeEquivalentTo(1))
	})
}

func TestStopLetsTheCallsInFlightFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p := &fakePlugin{}
		s := supervise(t, p, func(c *Options) { c.CallTimeout = time.Second })
		p.forcer(0).hang.Store(true)

		var callErr error
		called := make(chan struct{})
		go func() {
			defer close(called)
			_, callErr = scheduleVia(s)
		}()
		synctest.Wait()
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			s.stop()
		}()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		g.Expect(p.proc(0).kills.Load()).To(BeZero(), "killed under a call in flight")
		_, err := scheduleVia(s)
		g.Expect(status.Code(err)).To(Equal(codes.Unavailable), "no new calls once stopping")

		<-called
		<-stopped
		g.Expect(status.Code(callErr)).To(Equal(codes.DeadlineExceeded))
		g.Expect(p.proc(0).kills.Load()).To(BeEquivalentTo(1))
		g.Expect(s.status().State).To(Equal(StateStopped))
	})
}

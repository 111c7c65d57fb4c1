package within_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/within"
)

// stubborn is an in-process policy that ignores its context: each call returns when released.
type stubborn struct {
	calls   atomic.Int64
	release chan struct{}
}

func newStubborn() *stubborn { return &stubborn{release: make(chan struct{})} }

func (s *stubborn) call(context.Context) (string, error) {
	s.calls.Add(1)
	<-s.release
	return "late", nil
}

func TestACallThatAnswersInTimeGivesItsAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a within.Abandoned
		boom := errors.New("boom")
		for _, want := range []error{nil, boom} {
			start := time.Now()
			v, err := within.Do(context.Background(), &a, time.Second, func(ctx context.Context) (int, error) {
				time.Sleep(100 * time.Millisecond)
				_, ok := ctx.Deadline()
				g.Expect(ok).To(BeTrue(), "the call has a deadline")
				return 7, want
			})
			g.Expect(v).To(Equal(7))
			g.Expect(err == want).To(BeTrue(), "the call's own error: %v", err)
			g.Expect(time.Since(start)).To(Equal(100 * time.Millisecond))
		}
		g.Expect(a.Running()).To(BeZero())
	})
}

func TestACallThatIgnoresItsContextIsAbandonedAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a within.Abandoned
		p := newStubborn()
		start := time.Now()
		v, err := within.Do(context.Background(), &a, 200*time.Millisecond, p.call)
		g.Expect(time.Since(start)).To(Equal(200*time.Millisecond), "the caller waits for the deadline, no longer")
		g.Expect(v).To(BeEmpty())
		g.Expect(err).To(MatchError(context.DeadlineExceeded))
		g.Expect(err).To(MatchError("policy call abandoned at its 200ms deadline: context deadline exceeded"))
		g.Expect(a.Running()).To(Equal(1), "the abandoned call runs on")

		close(p.release)
		synctest.Wait()
		g.Expect(a.Running()).To(BeZero(), "and is no longer counted once it returns")
	})
}

func TestACallThatHonoursItsContextIsNotCountedOnceItReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a within.Abandoned
		_, err := within.Do(context.Background(), &a, time.Second, func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		})
		g.Expect(err).To(MatchError(context.DeadlineExceeded))
		synctest.Wait()
		g.Expect(a.Running()).To(BeZero())
	})
}

func TestAPolicyWithMaxAbandonedCallsRunningFailsAtOnceUntilOneReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a, other within.Abandoned
		p := newStubborn()
		for range within.MaxAbandoned {
			_, err := within.Do(context.Background(), &a, 100*time.Millisecond, p.call)
			g.Expect(err).To(MatchError(context.DeadlineExceeded))
		}
		g.Expect(a.Running()).To(Equal(within.MaxAbandoned))

		start := time.Now()
		_, err := within.Do(context.Background(), &a, 100*time.Millisecond, p.call)
		g.Expect(err).To(MatchError(within.ErrTooManyAbandoned))
		g.Expect(err).To(MatchError("policy call not made: 4 calls abandoned at their deadline still run: " + within.ErrTooManyAbandoned.Error()))
		g.Expect(time.Since(start)).To(BeZero(), "at once, so the caller falls back")
		g.Expect(p.calls.Load()).To(BeEquivalentTo(within.MaxAbandoned), "the policy is not called")

		// Another policy's abandoned calls are its own.
		v, err := within.Do(context.Background(), &other, 100*time.Millisecond, func(context.Context) (string, error) { return "ok", nil })
		g.Expect(v, err).To(Equal("ok"))

		// One abandoned call returns: the policy is called again.
		p.release <- struct{}{}
		synctest.Wait()
		g.Expect(a.Running()).To(Equal(within.MaxAbandoned - 1))
		_, err = within.Do(context.Background(), &a, 100*time.Millisecond, p.call)
		g.Expect(err).To(MatchError(context.DeadlineExceeded))
		g.Expect(p.calls.Load()).To(BeEquivalentTo(within.MaxAbandoned + 1))

		close(p.release)
		synctest.Wait()
		g.Expect(a.Running()).To(BeZero())
	})
}

func TestACallIsAbandonedWhenItsCallersContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a within.Abandoned
		p := newStubborn()
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := within.Do(ctx, &a, time.Second, p.call)
		g.Expect(time.Since(start)).To(Equal(50 * time.Millisecond))
		g.Expect(err).To(MatchError(context.Canceled))
		g.Expect(err).To(MatchError("policy call abandoned: context canceled"))

		_, err = within.Do(ctx, &a, time.Second, p.call)
		g.Expect(err).To(MatchError("policy call not made: context canceled"), "an ended context makes no call")
		g.Expect(p.calls.Load()).To(BeEquivalentTo(1))

		close(p.release)
		synctest.Wait()
		g.Expect(a.Running()).To(BeZero())
	})
}

func TestACallWithoutADeadlineOfItsOwnEndsWithItsCallersContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a within.Abandoned
		p := newStubborn()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := within.Do(ctx, &a, 0, p.call)
		g.Expect(time.Since(start)).To(Equal(3 * time.Second))
		g.Expect(err).To(MatchError(context.DeadlineExceeded))
		close(p.release)
		synctest.Wait()
	})
}

func TestACallThatPanicsFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		var a within.Abandoned
		_, err := within.Do(context.Background(), &a, time.Second, func(context.Context) (int, error) { panic("nil map") })
		g.Expect(err).To(MatchError("policy call panicked: nil map"))
		g.Expect(a.Running()).To(BeZero())
	})
}

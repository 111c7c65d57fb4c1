package retry_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/within"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// answer is a RetryForcer that always gives the same answer.
type answer struct {
	resp *pluginv1.ScheduleResponse
	err  error
}

func (a answer) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{}, nil
}

func (a answer) Configure(context.Context, *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{}, nil
}

func (a answer) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return a.resp, a.err
}

func after(d time.Duration, reason string) answer {
	return answer{resp: &pluginv1.ScheduleResponse{Delay: durationpb.New(d), Reason: reason}}
}

var oneType = &pluginv1.ScheduleRequest{Zone: "node-1", Failing: []*pluginv1.FailingKind{{Kind: "Mesh", RejectedNames: []string{"default"}}}}

func TestCheckedHoldsAnswersToTheHostsBounds(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	_, err := retry.Checked(after(2*time.Hour, ""), shared.Bounds{}).Schedule(ctx, oneType)
	g.Expect(err).To(MatchError("the host refuses this schedule: delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay)"))
	resp, err := retry.Checked(after(2*time.Hour, ""), shared.Bounds{MaxDelay: 3 * time.Hour}).Schedule(ctx, oneType)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetDelay().AsDuration()).To(Equal(2 * time.Hour))
	_, err = retry.Checked(after(time.Minute, ""), shared.Bounds{MaxDelay: time.Second}).Schedule(ctx, oneType)
	g.Expect(errors.As(err, new(*shared.BoundsError))).To(BeTrue())
	_, err = retry.Checked(answer{}, shared.Bounds{}).Schedule(ctx, oneType)
	g.Expect(err).To(MatchError(ContainSubstring("the answer is empty")))
	_, err = retry.Checked(answer{err: errors.New("boom")}, shared.Bounds{}).Schedule(ctx, oneType)
	g.Expect(err).To(MatchError("boom"))
}

func TestStandardFallsBackOnARefusedDecisionAndSaysWhy(t *testing.T) {
	g := NewWithT(t)
	var refused []error
	p := retry.Standard(func() shared.RetryForcer { return after(2*time.Hour, "two hours") }, after(time.Second, "built-in 1s"),
		retry.StandardConfig{OnFallback: func(_ *pluginv1.ScheduleRequest, err error) { refused = append(refused, err) }})
	resp, err := p.Schedule(context.Background(), oneType)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetDelay().AsDuration()).To(Equal(time.Second))
	g.Expect(resp.GetReason()).To(Equal("built-in fallback (the host refuses this schedule: delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay)): built-in 1s"))
	g.Expect(refused).To(HaveLen(1))
	g.Expect(refused[0]).To(MatchError(ContainSubstring("delay 2h0m0s")))

	// Within bounds the policy's own answer and reason stand.
	p = retry.Standard(func() shared.RetryForcer { return after(time.Minute, "a minute") }, after(time.Second, "built-in"),
		retry.StandardConfig{Bounds: shared.Bounds{MaxDelay: 2 * time.Minute}})
	resp, err = p.Schedule(context.Background(), oneType)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetReason()).To(Equal("a minute"))
}

// TestTheReasonOfTheDecisionInForce: insights show why a round waits, and forget it once the
// stream has nothing left to resend.
func TestTheReasonOfTheDecisionInForce(t *testing.T) {
	g := NewWithT(t)
	m := retry.NewMachine(1, "node-1")
	r := m.NACK(nack("Mesh", "default"), t0)
	g.Expect(r.Ask).NotTo(BeNil())
	r = m.Decided(r.Token, &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second), Reason: "fixed 1s"}, nil, t0)
	g.Expect(r.Decision).To(Equal(&retry.Decision{Round: 0, Delay: time.Second, Reason: "fixed 1s"}))
	g.Expect(m.State().Reason).To(Equal("fixed 1s"))

	r = m.Fired(r.Token, t0.Add(time.Second))
	r = m.NACK(nack("Mesh", "default"), t0.Add(time.Second))
	r = m.Decided(r.Token, nil, errors.New("plugin down"), t0.Add(time.Second))
	g.Expect(r.Decision.Round).To(Equal(uint32(1)))
	g.Expect(r.Decision.Reason).To(Equal("no policy answered (plugin down); retrying in 1s"))
	g.Expect(m.State().Reason).To(Equal(r.Decision.Reason))

	m.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: "Mesh", Versions: event.VersionsOf(map[string]string{"default": "v2"})}, t0.Add(2*time.Second))
	g.Expect(m.State().Reason).To(BeEmpty())
	g.Expect(m.State().Round).To(BeZero())
}

// seen is a RetryForcer that records the max_delay of the request it is asked, and answers.
type seen struct {
	answer
	max *[]time.Duration
}

func (s seen) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	*s.max = append(*s.max, req.GetMaxDelay().AsDuration())
	return s.answer.Schedule(ctx, req)
}

// TestStandardTellsThePolicyTheHostsMaximum: every request carries --retry-max-delay, for the
// policy in force and for the built-in fallback alike.
func TestStandardTellsThePolicyTheHostsMaximum(t *testing.T) {
	g := NewWithT(t)
	var got []time.Duration
	policy := seen{answer{err: errors.New("down")}, &got}
	builtin := seen{after(time.Second, "built-in"), &got}
	for _, tc := range []struct {
		bounds shared.Bounds
		want   time.Duration
	}{{shared.Bounds{}, time.Hour}, {shared.Bounds{MaxDelay: 5 * time.Second}, 5 * time.Second}} {
		got = nil
		req := &pluginv1.ScheduleRequest{Zone: "node-1", Failing: []*pluginv1.FailingKind{{Kind: "Mesh", RejectedNames: []string{"default"}}}}
		p := retry.Standard(func() shared.RetryForcer { return policy }, builtin, retry.StandardConfig{Bounds: tc.bounds})
		_, err := p.Schedule(context.Background(), req)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal([]time.Duration{tc.want, tc.want}), "the policy, then the fallback")
	}
}

// deaf is a retry policy that ignores its context: each call waits until release is closed.
type deaf struct {
	shared.RetryForcer // Configure: not called
	release            chan struct{}
	made, returned     atomic.Int64
}

func (d *deaf) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	d.made.Add(1)
	<-d.release
	d.returned.Add(1)
	return nil, errors.New("too late")
}

// A policy that ignores its context is given up on at its deadline; at most MaxAbandoned of its
// calls run on, and a call while that many do is not made at all: a slow policy cannot grow the
// host's goroutines with every decision.
func TestWithDeadlineLeavesAtMostMaxAbandonedCallsRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		d := &deaf{release: make(chan struct{})}
		p := retry.WithDeadline(d, 200*time.Millisecond)
		for i := range 10 {
			_, err := p.Schedule(context.Background(), oneType)
			g.Expect(err).To(HaveOccurred(), "call %d", i)
			g.Expect(d.made.Load() - d.returned.Load()).To(BeNumerically("<=", within.MaxAbandoned))
		}
		g.Expect(d.made.Load()).To(BeEquivalentTo(within.MaxAbandoned))
		_, err := p.Schedule(context.Background(), oneType)
		g.Expect(err).To(MatchError(within.ErrTooManyAbandoned))
		close(d.release)
		synctest.Wait()
		g.Expect(d.returned.Load()).To(BeEquivalentTo(within.MaxAbandoned))
	})
}

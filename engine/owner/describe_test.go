package owner

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// describing is an OwnerCheck whose Describe counts its calls and, while blocking, waits until
// released (or its deadline).
type describing struct {
	*ownerpredict.Predictor
	calls    atomic.Int32
	blocking atomic.Bool
	release  chan struct{}
	fail     atomic.Bool
}

func (d *describing) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	d.calls.Add(1)
	if d.blocking.Load() {
		select {
		case <-d.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if d.fail.Load() {
		return nil, errors.New("plugin down")
	}
	return d.Predictor.Describe(ctx)
}

// newDescribed is a described of p, whose generation is gen.
func newDescribed(p *describing, gen *atomic.Uint64) *described {
	return &described{policy: func() shared.OwnerCheck { return p }, generation: gen.Load}
}

// blockingDescribed is a described of a policy that blocks when told to, in generation 0.
func blockingDescribed() (*describing, *atomic.Uint64, *described) {
	p := &describing{Predictor: ownerpredict.New(), release: make(chan struct{})}
	gen := &atomic.Uint64{}
	return p, gen, newDescribed(p, gen)
}

// getting calls get in a goroutine; its answer comes on the channel.
func getting(d *described, ctx context.Context) <-chan declaration {
	out := make(chan declaration, 1)
	go func() { out <- d.get(ctx) }()
	return out
}

// returned reports whether an answer is there, once the bubble is idle.
func returned(c <-chan declaration) (declaration, bool) {
	synctest.Wait()
	select {
	case d := <-c:
		return d, true
	default:
		return declaration{}, false
	}
}

// Defect 4: get held its mutex across the Describe call, so every check worker queued behind
// one slow plugin call every describeTTL and on every reload. Now one caller asks; the others go
// on with the declaration of the current generation they have, and wait only when they have none.
func TestDescribeIsNotHeldAcrossTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p, gen, d := blockingDescribed()
		gen.Store(1)
		ctx := t.Context()

		first := d.get(ctx)
		g.Expect(first).To(Equal(declaration{ownerTypes: []string{"Mesh"}, shared: true, generation: 1}))
		g.Expect(d.get(ctx)).To(Equal(first), "fresh: not asked again")
		g.Expect(p.calls.Load()).To(BeEquivalentTo(1))

		// Stale: one caller asks, and its call hangs.
		time.Sleep(describeTTL)
		p.blocking.Store(true)
		asking := getting(d, ctx)
		_, done := returned(asking)
		g.Expect(done).To(BeFalse(), "the caller that asks waits for its answer")
		g.Expect(p.calls.Load()).To(BeEquivalentTo(2))

		// Another caller has a declaration of this generation: it goes on with it at once.
		other, done := returned(getting(d, ctx))
		g.Expect(done).To(BeTrue(), "a caller with a declaration of the generation does not wait for the call in flight")
		g.Expect(other).To(Equal(first))
		g.Expect(p.calls.Load()).To(BeEquivalentTo(2), "one call in flight")

		close(p.release)
		asked, done := returned(asking)
		g.Expect(done).To(BeTrue())
		g.Expect(asked).To(Equal(first))
	})
}

// After a reload no declaration is of the current generation: the callers wait for the one call
// in flight, and take its answer.
func TestDescribeAfterAReloadWaitsForTheOneCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p, gen, d := blockingDescribed()
		ctx := t.Context()
		g.Expect(d.get(ctx).generation).To(BeZero())

		gen.Store(1)
		p.blocking.Store(true)
		var callers []<-chan declaration
		for range 3 {
			callers = append(callers, getting(d, ctx))
		}
		for _, c := range callers {
			_, done := returned(c)
			g.Expect(done).To(BeFalse(), "nothing of generation 1 yet")
		}
		g.Expect(p.calls.Load()).To(BeEquivalentTo(2), "one call for the three")

		// One waiter gives up: it goes on sharing nothing.
		gone, cancel := context.WithCancel(ctx)
		giving := getting(d, gone)
		cancel()
		given, done := returned(giving)
		g.Expect(done).To(BeTrue())
		g.Expect(given).To(Equal(declaration{generation: 1}))

		close(p.release)
		for _, c := range callers {
			got, done := returned(c)
			g.Expect(done).To(BeTrue())
			g.Expect(got).To(Equal(declaration{ownerTypes: []string{"Mesh"}, shared: true, generation: 1}))
		}
		g.Expect(p.calls.Load()).To(BeEquivalentTo(2))
	})
}

// A generation that changes while a call is in flight: the answer is of the generation read
// before the call, so the next caller asks again.
func TestDescribeAsksAgainWhenTheGenerationMovedDuringTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewWithT(t)
		p, gen, d := blockingDescribed()
		p.blocking.Store(true)
		asking := getting(d, t.Context())
		synctest.Wait()
		gen.Store(1)
		waiting := getting(d, t.Context())
		close(p.release)
		first, done := returned(asking)
		g.Expect(done).To(BeTrue())
		g.Expect(first.generation).To(BeZero())
		second, done := returned(waiting)
		g.Expect(done).To(BeTrue())
		g.Expect(second.generation).To(BeEquivalentTo(1))
		g.Expect(p.calls.Load()).To(BeEquivalentTo(2))
	})
}

func TestDescribeDeclares(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fail       bool
		generation bool
		want       declaration
	}{
		{name: "declared, in a known generation", generation: true, want: declaration{ownerTypes: []string{"Mesh"}, shared: true, generation: 3}},
		{name: "no generation: never shared", want: declaration{ownerTypes: []string{"Mesh"}}},
		{name: "Describe failed: the whole inventory, nothing shared", fail: true, generation: true, want: declaration{generation: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := NewWithT(t)
				p := &describing{Predictor: ownerpredict.New()}
				p.fail.Store(tc.fail)
				var gen atomic.Uint64
				gen.Store(3)
				d := newDescribed(p, &gen)
				if !tc.generation {
					d.generation = nil
				}
				g.Expect(d.get(t.Context())).To(Equal(tc.want))

				// Asked again after describeTTL, not before.
				time.Sleep(describeTTL - time.Nanosecond)
				d.get(t.Context())
				g.Expect(p.calls.Load()).To(BeEquivalentTo(1))
				time.Sleep(time.Nanosecond)
				d.get(t.Context())
				g.Expect(p.calls.Load()).To(BeEquivalentTo(2))
			})
		})
	}
}

// Many callers at once, with time passing and generations changing: every answer is of a
// generation no older than the one current when the caller started.
func TestDescribeUnderConcurrentCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &describing{Predictor: ownerpredict.New()}
		var gen atomic.Uint64
		d := newDescribed(p, &gen)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for j := range 50 {
					if (i+j)%7 == 0 {
						gen.Add(1)
					}
					before := gen.Load()
					if got := d.get(t.Context()); got.generation < before {
						t.Errorf("generation %d answered, %d current before", got.generation, before)
					}
					time.Sleep(time.Second)
				}
			})
		}
		wg.Wait()
	})
}

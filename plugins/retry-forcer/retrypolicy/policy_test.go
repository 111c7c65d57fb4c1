package retrypolicy_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

const ms = time.Millisecond

// seeded returns the fixed random source the exact-value tests use.
func seeded() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

func mustPolicy(t *testing.T, cfg retrypolicy.Config, opts ...retrypolicy.Option) retrypolicy.Policy {
	t.Helper()
	p, err := retrypolicy.NewPolicy(cfg, opts...)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return p
}

func decorrelatedCfg() retrypolicy.Config {
	return retrypolicy.Config{Policy: retrypolicy.Decorrelated, Base: 100 * ms, Max: 30 * time.Second}
}

func exponentialCfg(mutate func(*retrypolicy.Config)) retrypolicy.Config {
	c := retrypolicy.Default()
	if mutate != nil {
		mutate(&c)
	}
	return c
}

func TestExponentialWithoutJitterGrowsAndCaps(t *testing.T) {
	cases := []struct {
		name  string
		cfg   retrypolicy.Config
		round uint32
		want  time.Duration
	}{
		{"round 0 is base", exponentialCfg(nil), 0, 100 * ms},
		{"round 1 doubles", exponentialCfg(nil), 1, 200 * ms},
		{"round 3", exponentialCfg(nil), 3, 800 * ms},
		{"round 8 just under max", exponentialCfg(nil), 8, 25600 * ms},
		{"round 9 capped at max", exponentialCfg(nil), 9, 30 * time.Second},
		{"round 64 capped", exponentialCfg(nil), 64, 30 * time.Second},
		{"round 10,000 capped", exponentialCfg(nil), 10_000, 30 * time.Second},
		{"round MaxUint32 capped", exponentialCfg(nil), math.MaxUint32, 30 * time.Second},
		{"factor 1 stays at base", exponentialCfg(func(c *retrypolicy.Config) { c.Factor = 1 }), 10_000, 100 * ms},
		{"fractional factor", exponentialCfg(func(c *retrypolicy.Config) { c.Factor = 1.5 }), 3, 337500 * time.Microsecond},
		{"huge factor saturates", exponentialCfg(func(c *retrypolicy.Config) { c.Factor = 1e300 }), 2, 30 * time.Second},
		{"max equal to base", exponentialCfg(func(c *retrypolicy.Config) { c.Max = 100 * ms }), 5, 100 * ms},
		{"huge max and round", exponentialCfg(func(c *retrypolicy.Config) { c.Max = math.MaxInt64 }), 10_000, math.MaxInt64},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			tc.cfg.Jitter = retrypolicy.JitterNone
			p := mustPolicy(t, tc.cfg)
			d, giveUp := p.Next(tc.round, 0)
			g.Expect(giveUp).To(BeFalse())
			g.Expect(d).To(Equal(tc.want))
		})
	}
}

func TestExponentialFullJitterExactWithSeed(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, retrypolicy.Default(), retrypolicy.WithRand(seeded()))
	want := []time.Duration{
		77167954, 123670809, 313986773, 637480667, 375607757,
		132815617, 3199935323, 5752664252, 3400530273, 5512751558,
	}
	// The same draws, computed from the definition: uniform in [min, cap].
	ref := seeded()
	for round, w := range want {
		cap := min(30*time.Second, 100*ms<<round)
		g.Expect(ms+time.Duration(ref.Uint64N(uint64(cap-ms)+1))).To(Equal(w), "round %d, reference", round)

		d, giveUp := p.Next(uint32(round), 0)
		g.Expect(giveUp).To(BeFalse())
		g.Expect(d).To(Equal(w), "round %d", round)
	}
}

// draws returns the smallest and the largest of n delays next draws.
func draws(n int, next func() time.Duration) (lo, hi time.Duration) {
	lo, hi = math.MaxInt64, math.MinInt64
	for range n {
		d := next()
		lo, hi = min(lo, d), max(hi, d)
	}
	return lo, hi
}

func TestExponentialFullJitterBounds(t *testing.T) {
	cases := []struct {
		round uint32
		cap   time.Duration
	}{
		{0, 100 * ms}, {1, 200 * ms}, {4, 1600 * ms}, {8, 25600 * ms}, {9, 30 * time.Second},
		{20, 30 * time.Second}, {10_000, 30 * time.Second}, {math.MaxUint32, 30 * time.Second},
	}
	for _, tc := range cases {
		g := NewWithT(t)
		p := mustPolicy(t, retrypolicy.Default(), retrypolicy.WithRand(seeded()))
		lo, hi := draws(10_000, func() time.Duration {
			d, giveUp := p.Next(tc.round, 0)
			g.Expect(giveUp).To(BeFalse())
			return d
		})
		g.Expect(lo).To(BeNumerically(">=", ms), "round %d: smallest draw", tc.round)
		g.Expect(hi).To(BeNumerically("<=", tc.cap), "round %d: largest draw", tc.round)
		// Uniform over [1ms, cap]: 10,000 draws come within 1% of both ends.
		g.Expect(lo).To(BeNumerically("<", ms+tc.cap/100), "round %d: smallest draw", tc.round)
		g.Expect(hi).To(BeNumerically(">", tc.cap-tc.cap/100), "round %d: largest draw", tc.round)
	}
}

func TestExponentialMinIsTheFloor(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, exponentialCfg(func(c *retrypolicy.Config) { c.Min = 100 * ms }), retrypolicy.WithRand(seeded()))
	g.Expect(p.Floor()).To(Equal(100 * ms))
	for range 1000 {
		d, _ := p.Next(0, 0)
		g.Expect(d).To(Equal(100*ms), "min = base leaves no room to jitter in round 0")
		d, _ = p.Next(1, 0)
		g.Expect(d).To(BeNumerically(">=", 100*ms))
		g.Expect(d).To(BeNumerically("<=", 200*ms))
	}
}

func TestFixed(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: 1500 * ms})
	for _, round := range []uint32{0, 1, 2, 100, 10_000, math.MaxUint32} {
		d, giveUp := p.Next(round, 7*time.Second)
		g.Expect(giveUp).To(BeFalse())
		g.Expect(d).To(Equal(1500 * ms))
	}
}

func TestDecorrelatedExactWithSeed(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, decorrelatedCfg(), retrypolicy.WithRand(seeded()))
	want := []time.Duration{
		253874654, 507848977, 1216670075, 2927925999, 2134403124,
		359725362, 589501636, 849799206, 425278384, 316037575,
	}
	ref := seeded()
	var last, refLast time.Duration
	for round, w := range want {
		// The definition: min(max, uniform[base, 3*last]), last 0 taken as base.
		hi := 3 * max(refLast, 100*ms)
		refLast = min(30*time.Second, 100*ms+time.Duration(ref.Uint64N(uint64(hi-100*ms)+1)))
		g.Expect(refLast).To(Equal(w), "round %d, reference", round)

		d, giveUp := p.Next(uint32(round), last)
		g.Expect(giveUp).To(BeFalse())
		g.Expect(d).To(Equal(w), "round %d", round)
		last = d
	}
}

func TestDecorrelatedBounds(t *testing.T) {
	cases := []struct {
		name   string
		last   time.Duration
		lo, hi time.Duration
		// spread: the draws cover [lo, hi] (false when most of them are clamped to max).
		spread bool
	}{
		{"last 0 is taken as base", 0, 100 * ms, 300 * ms, true},
		{"negative last is taken as base", -time.Second, 100 * ms, 300 * ms, true},
		{"grows up to three times last", 2 * time.Second, 100 * ms, 6 * time.Second, true},
		{"capped at max", 20 * time.Second, 100 * ms, 30 * time.Second, true},
		{"last beyond max", time.Hour, 100 * ms, 30 * time.Second, false},
		{"last near MaxInt64 does not overflow", math.MaxInt64, 30 * time.Second, 30 * time.Second, false},
		{"last far below base gives base", 10 * ms, 100 * ms, 100 * ms, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := mustPolicy(t, decorrelatedCfg(), retrypolicy.WithRand(seeded()))
			lo, hi := draws(10_000, func() time.Duration {
				d, giveUp := p.Next(3, tc.last)
				g.Expect(giveUp).To(BeFalse())
				return d
			})
			g.Expect(lo).To(BeNumerically(">=", tc.lo))
			g.Expect(hi).To(BeNumerically("<=", tc.hi))
			if tc.spread {
				span := tc.hi - tc.lo
				g.Expect(lo).To(BeNumerically("<=", tc.lo+span/100))
				g.Expect(hi).To(BeNumerically(">=", tc.hi-span/100))
			} else {
				g.Expect(hi).To(Equal(tc.hi))
			}
		})
	}
}

func TestDecorrelatedChainStaysInBounds(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, decorrelatedCfg(), retrypolicy.WithRand(seeded()))
	var last time.Duration
	for round := range uint32(10_000) {
		d, _ := p.Next(round, last)
		g.Expect(d).To(BeNumerically(">=", p.Floor()))
		g.Expect(d).To(BeNumerically("<=", min(p.MaxDelay(), 3*max(last, 100*ms))))
		last = d
	}
}

func TestGiveUp(t *testing.T) {
	cases := []struct {
		name string
		cfg  retrypolicy.Config
	}{
		{"exponential", exponentialCfg(func(c *retrypolicy.Config) { c.MaxAttempts = 3 })},
		{"exponential without jitter", exponentialCfg(func(c *retrypolicy.Config) { c.MaxAttempts = 3; c.Jitter = retrypolicy.JitterNone })},
		{"fixed", retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: time.Second, MaxAttempts: 3}},
		{"decorrelated", retrypolicy.Config{Policy: retrypolicy.Decorrelated, Base: 100 * ms, Max: time.Second, MaxAttempts: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			p := mustPolicy(t, tc.cfg)
			for round := range uint32(3) {
				d, giveUp := p.Next(round, time.Second)
				g.Expect(giveUp).To(BeFalse(), "round %d", round)
				g.Expect(d).To(BeNumerically(">", 0))
			}
			for _, round := range []uint32{3, 4, 10_000, math.MaxUint32} {
				d, giveUp := p.Next(round, time.Second)
				g.Expect(giveUp).To(BeTrue(), "round %d", round)
				g.Expect(d).To(BeZero())
			}
		})
	}
}

func TestMaxAttemptsOneGivesUpAfterTheFirstRound(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, exponentialCfg(func(c *retrypolicy.Config) { c.MaxAttempts = 1 }))
	_, giveUp := p.Next(0, 0)
	g.Expect(giveUp).To(BeFalse())
	_, giveUp = p.Next(1, 0)
	g.Expect(giveUp).To(BeTrue())
}

func TestEveryPolicyStaysWithinFloorAndMaxDelay(t *testing.T) {
	cases := []struct {
		name              string
		cfg               retrypolicy.Config
		floor, maxDelay   time.Duration
		wantName, wantStr string
	}{
		{"exponential", retrypolicy.Default(), ms, 30 * time.Second, retrypolicy.Exponential,
			"exponential base=100ms factor=2 max=30s min=1ms jitter=full"},
		{"exponential without jitter", exponentialCfg(func(c *retrypolicy.Config) { c.Jitter = retrypolicy.JitterNone; c.MaxAttempts = 7 }),
			100 * ms, 30 * time.Second, retrypolicy.Exponential,
			"exponential base=100ms factor=2 max=30s min=1ms jitter=none maxAttempts=7"},
		{"fixed", retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: time.Second}, time.Second, time.Second, retrypolicy.Fixed, "fixed delay=1s"},
		{"decorrelated", retrypolicy.Config{Policy: retrypolicy.Decorrelated, Base: 50 * ms, Max: 5 * time.Second, MaxAttempts: 2},
			50 * ms, 5 * time.Second, retrypolicy.Decorrelated, "decorrelated base=50ms max=5s maxAttempts=2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := tc.cfg
			cfg.MaxAttempts = 0 // never give up: every round must yield a delay
			p := mustPolicy(t, cfg, retrypolicy.WithRand(seeded()))
			g.Expect(p.Floor()).To(Equal(tc.floor))
			g.Expect(p.MaxDelay()).To(Equal(tc.maxDelay))
			g.Expect(p.Name()).To(Equal(tc.wantName))
			rounds := []uint32{0, 1, 2, 5, 10, 31, 32, 63, 64, 1000, 10_000, math.MaxUint32}
			lasts := []time.Duration{0, 1, ms, time.Second, time.Minute, math.MaxInt64}
			for _, round := range rounds {
				for _, last := range lasts {
					d, giveUp := p.Next(round, last)
					g.Expect(giveUp).To(BeFalse())
					g.Expect(d).To(BeNumerically(">=", tc.floor), "round %d last %s", round, last)
					g.Expect(d).To(BeNumerically("<=", tc.maxDelay), "round %d last %s", round, last)
				}
			}
		})
	}
	for _, tc := range cases {
		g := NewWithT(t)
		g.Expect(mustPolicy(t, tc.cfg).String()).To(Equal(tc.wantStr))
	}
}

func TestNewPolicyRejectsAnInvalidConfig(t *testing.T) {
	g := NewWithT(t)
	_, err := retrypolicy.NewPolicy(retrypolicy.Config{Policy: retrypolicy.Fixed})
	g.Expect(err).To(MatchError("delay: must be > 0, got 0s"))
	_, err = retrypolicy.NewPolicy(retrypolicy.Config{})
	g.Expect(err).To(MatchError(ContainSubstring(`policy: unknown policy ""`)))
}

func TestWithoutWithRandUsesTheGlobalSource(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, retrypolicy.Default())
	for range 1000 {
		d, _ := p.Next(2, 0)
		g.Expect(d).To(BeNumerically(">=", ms))
		g.Expect(d).To(BeNumerically("<=", 400*ms))
	}
}

// TestJitterIsSafeForConcurrentUse shares one seeded *rand.Rand between goroutines; run with
// -race, it fails if the source is not guarded.
func TestJitterIsSafeForConcurrentUse(t *testing.T) {
	g := NewWithT(t)
	p := mustPolicy(t, retrypolicy.Default(), retrypolicy.WithRand(seeded()))
	q := mustPolicy(t, decorrelatedCfg(), retrypolicy.WithRand(seeded()))
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			for round := range uint32(100) {
				d, _ := p.Next(round, 0)
				e, _ := q.Next(round, time.Duration(i)*ms)
				if d <= 0 || d > 30*time.Second || e < 100*ms || e > 30*time.Second {
					t.Errorf("out of bounds: %s %s", d, e)
				}
			}
		})
	}
	wg.Wait()
	g.Expect(t.Failed()).To(BeFalse())
}

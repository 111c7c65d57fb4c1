// Package retrypolicy holds kds-host's reference retry policies (exponential, fixed, decorrelated
// jitter), the policy document that chooses one, and Forcer, which serves them as a RetryForcer.
package retrypolicy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// Policy names, as the policy document spells them.
const (
	Exponential  = "exponential"
	Fixed        = "fixed"
	Decorrelated = "decorrelated"
)

// Jitter modes of the exponential policy.
const (
	// JitterFull draws each delay uniformly between the floor (min) and the round's cap.
	JitterFull = "full"
	// JitterNone uses the round's cap itself.
	JitterNone = "none"
)

// Policy computes the delay before a retry round. Like a client-go workqueue rate limiter it is
// pure policy: the caller keeps the state (round and last delay) and passes it in. A Policy is
// safe for concurrent use.
type Policy interface {
	// Next returns the delay before round (0 for the first retry) given the previous round's
	// delay (0 for the first), or giveUp when the policy's attempts are exhausted. When giveUp
	// is false the delay is within [Floor(), MaxDelay()].
	Next(round uint32, last time.Duration) (delay time.Duration, giveUp bool)
	// MaxDelay is the largest delay Next returns.
	MaxDelay() time.Duration
	// Floor is the smallest delay Next returns when it does not give up; it is positive.
	Floor() time.Duration
	// Name is the policy's name: exponential, fixed or decorrelated.
	Name() string
	// String describes the policy and its parameters on one line.
	String() string
}

// Option changes how a policy or a Forcer is built.
type Option func(*options)

type options struct {
	rnd *source
}

// WithRand makes jitter draw from r, so a fixed seed gives fixed delays. The policy (or every
// policy a Forcer builds) guards r with its own mutex, so r must not be used elsewhere. Without
// it, jitter draws from math/rand/v2's randomly seeded global source.
func WithRand(r *rand.Rand) Option {
	return func(o *options) { o.rnd = &source{r: r} }
}

func buildOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.rnd == nil {
		o.rnd = &source{}
	}
	return o
}

// source is a random source safe for concurrent use.
type source struct {
	mu sync.Mutex
	r  *rand.Rand // nil: math/rand/v2's global source, which is already safe
}

// between returns a uniform duration in [lo, hi], or lo when hi <= lo.
func (s *source) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	n := uint64(hi-lo) + 1 // lo >= 0, so hi-lo does not overflow and n >= 2
	if s.r == nil {
		return lo + time.Duration(rand.Uint64N(n))
	}
	s.mu.Lock()
	v := s.r.Uint64N(n)
	s.mu.Unlock()
	return lo + time.Duration(v)
}

// NewPolicy builds the policy cfg describes, after validating it.
func NewPolicy(cfg Config, opts ...Option) (Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newPolicy(cfg, buildOptions(opts).rnd), nil
}

// newPolicy builds a policy from a valid cfg.
func newPolicy(cfg Config, rnd *source) Policy {
	switch cfg.Policy {
	case Fixed:
		return &fixed{delay: cfg.Delay, maxAttempts: cfg.MaxAttempts}
	case Decorrelated:
		return &decorrelated{base: cfg.Base, max: cfg.Max, maxAttempts: cfg.MaxAttempts, rnd: rnd}
	default:
		return &exponential{base: cfg.Base, factor: cfg.Factor, max: cfg.Max, min: cfg.Min,
			jitter: cfg.Jitter, maxAttempts: cfg.MaxAttempts, rnd: rnd}
	}
}

// exhausted reports whether round is past the last allowed attempt (maxAttempts 0: never).
func exhausted(maxAttempts, round uint32) bool {
	return maxAttempts > 0 && round >= maxAttempts
}

func attemptsSuffix(maxAttempts uint32) string {
	if maxAttempts == 0 {
		return ""
	}
	return fmt.Sprintf(" maxAttempts=%d", maxAttempts)
}

func formatFactor(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// exponential grows the delay by factor each round up to max: cap = min(max, base*factor^round).
// With full jitter the delay is uniform in [min, cap], with none it is cap.
type exponential struct {
	base, max, min time.Duration
	factor         float64
	jitter         string
	maxAttempts    uint32
	rnd            *source
}

func (p *exponential) Next(round uint32, _ time.Duration) (time.Duration, bool) {
	if exhausted(p.maxAttempts, round) {
		return 0, true
	}
	c := p.cap(round)
	if p.jitter == JitterNone {
		return c, false
	}
	return p.rnd.between(p.min, c), false
}

// cap is min(max, base*factor^round), computed in floating point so that a huge round (or
// factor) saturates at max instead of overflowing.
func (p *exponential) cap(round uint32) time.Duration {
	f := float64(p.base) * math.Pow(p.factor, float64(round))
	if math.IsNaN(f) || f >= float64(p.max) {
		return p.max
	}
	return max(time.Duration(f), p.base) // rounding never takes it below base
}

func (p *exponential) MaxDelay() time.Duration { return p.max }

func (p *exponential) Floor() time.Duration {
	if p.jitter == JitterNone {
		return p.base
	}
	return p.min
}

func (p *exponential) Name() string { return Exponential }

func (p *exponential) String() string {
	return fmt.Sprintf("exponential base=%s factor=%s max=%s min=%s jitter=%s%s",
		p.base, formatFactor(p.factor), p.max, p.min, p.jitter, attemptsSuffix(p.maxAttempts))
}

// fixed waits the same delay every round.
type fixed struct {
	delay       time.Duration
	maxAttempts uint32
}

func (p *fixed) Next(round uint32, _ time.Duration) (time.Duration, bool) {
	if exhausted(p.maxAttempts, round) {
		return 0, true
	}
	return p.delay, false
}

func (p *fixed) MaxDelay() time.Duration { return p.delay }
func (p *fixed) Floor() time.Duration    { return p.delay }
func (p *fixed) Name() string            { return Fixed }

func (p *fixed) String() string {
	return fmt.Sprintf("fixed delay=%s%s", p.delay, attemptsSuffix(p.maxAttempts))
}

// decorrelated is AWS's "decorrelated jitter": delay = min(max, uniform[base, 3*last]), with a
// last delay of 0 taken as base.
type decorrelated struct {
	base, max   time.Duration
	maxAttempts uint32
	rnd         *source
}

func (p *decorrelated) Next(round uint32, last time.Duration) (time.Duration, bool) {
	if exhausted(p.maxAttempts, round) {
		return 0, true
	}
	if last <= 0 {
		last = p.base
	}
	hi := time.Duration(math.MaxInt64)
	if last <= math.MaxInt64/3 {
		hi = 3 * last
	}
	return min(p.max, p.rnd.between(p.base, hi)), false
}

func (p *decorrelated) MaxDelay() time.Duration { return p.max }
func (p *decorrelated) Floor() time.Duration    { return p.base }
func (p *decorrelated) Name() string            { return Decorrelated }

func (p *decorrelated) String() string {
	return fmt.Sprintf("decorrelated base=%s max=%s%s", p.base, p.max, attemptsSuffix(p.maxAttempts))
}

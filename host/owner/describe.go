package owner

// What the policy in force declared in Describe, cached for the checks.
//
// Invariants:
//   - described.mu guards decl and at; decl is one Describe answer (or the failure of one) for
//     decl.generation, asked at time at.

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kds-host/kds-host/shared"
)

// described is what the policy in force declared in Describe, asked again at most every
// describeTTL, and at once when its generation changes (a reload brings another policy).
type described struct {
	policy     func() shared.OwnerCheck
	generation func() uint64 // nil: unknown, so answers are never shared

	mu   sync.Mutex
	decl declaration
	at   time.Time
}

// declaration is one Describe answer, as Holds uses it.
type declaration struct {
	kinds      []string // owner_kinds; nil: send the whole inventory (nothing declared, or Describe failed)
	shared     bool     // answers may be shared between zones: zone_independent, in a known generation
	generation uint64   // the generation the answer came from
}

const describeTTL = 10 * time.Second

func (o *described) get(ctx context.Context) declaration {
	o.mu.Lock()
	defer o.mu.Unlock()
	var gen uint64
	if o.generation != nil {
		gen = o.generation()
	}
	if !o.at.IsZero() && time.Since(o.at) < describeTTL && gen == o.decl.generation {
		return o.decl
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	d, err := o.policy().Describe(dctx)
	cancel()
	o.decl, o.at = declaration{generation: gen, shared: err == nil && d.GetZoneIndependent() && o.generation != nil}, time.Now()
	if err == nil && len(d.GetOwnerKinds()) > 0 {
		o.decl.kinds = slices.Clone(d.GetOwnerKinds())
	}
	return o.decl
}

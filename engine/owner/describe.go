package owner

// What the policy in force declared in Describe, cached for the checks.
//
// Invariants:
//   - described.mu guards decl and at; decl is one Describe answer (or the failure of one) for
//     decl.generation, asked at time at; asking is non-nil exactly while one caller's Describe
//     call is in flight, and that caller alone stores its answer and closes asking.
//   - The mutex is never held across the Describe call.

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

	mu     sync.Mutex // guards decl, at and asking
	decl   declaration
	at     time.Time     // when decl was asked; zero: never
	asking chan struct{} // closed when the call in flight returns; nil: none in flight
}

// declaration is one Describe answer, as Holds uses it.
type declaration struct {
	ownerTypes []string // owner_kinds; nil: send the whole inventory (nothing declared, or Describe failed)
	shared     bool     // answers may be shared between nodes: zone_independent, in a known generation
	generation uint64   // the generation the answer came from
}

const describeTTL = 10 * time.Second

// get is the declaration of the policy in force. When it is due, one caller asks Describe; the
// others go on with the declaration they have if it is of the current generation, and wait for
// the call in flight only when it is not. When ctx is done first, it is a declaration that
// shares nothing and asks for the whole inventory.
func (o *described) get(ctx context.Context) declaration {
	for {
		var gen uint64
		if o.generation != nil {
			gen = o.generation()
		}
		o.mu.Lock()
		current := !o.at.IsZero() && gen == o.decl.generation
		if current && time.Since(o.at) < describeTTL {
			decl := o.decl
			o.mu.Unlock()
			return decl
		}
		if asking := o.asking; asking != nil {
			decl := o.decl
			o.mu.Unlock()
			if current {
				return decl // due again, but still of this generation
			}
			select {
			case <-asking:
				continue
			case <-ctx.Done():
				return declaration{generation: gen}
			}
		}
		asking := make(chan struct{})
		o.asking = asking
		o.mu.Unlock()

		decl := o.ask(ctx, gen)

		o.mu.Lock()
		o.decl, o.at, o.asking = decl, time.Now(), nil
		o.mu.Unlock()
		close(asking)
		return decl
	}
}

// ask calls Describe, for generation gen.
func (o *described) ask(ctx context.Context, gen uint64) declaration {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d, err := o.policy().Describe(dctx)
	decl := declaration{generation: gen, shared: err == nil && d.GetZoneIndependent() && o.generation != nil}
	if err == nil && len(d.GetOwnerKinds()) > 0 {
		decl.ownerTypes = slices.Clone(d.GetOwnerKinds())
	}
	return decl
}

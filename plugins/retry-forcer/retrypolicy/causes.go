package retrypolicy

import (
	"fmt"
	"slices"
	"time"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// causePlan is a round shaped by the client's causes.
type causePlan struct {
	delay time.Duration
	kinds []string
	hold  []*pluginv1.HeldName
	why   string // appended to the reason
}

// planByCause shapes the policy's delay for this round by why the client refused each name:
//
//   - an INVALID name refused as INVALID invalidAttempts times in a row at one version (its
//     cause_attempts; attempts from a host that predates it) is put in hold, which the host
//     parks until its content changes: the same content again cannot help. The NACKs it had
//     under another cause (TRANSIENT while the client's admission was down) do not count;
//   - a name without a cause (a client that does not say), or INVALID before that, takes the
//     policy's delay as it is;
//   - TRANSIENT takes it capped at transientMax (drawn in [transientMax/2, transientMax] past
//     half of it, never below the policy's floor): the client asks again by itself the moment it
//     can, so the timer is only the safety net;
//   - MISSING_OWNER waits ownerWait (capped at the policy's max): the host resends at once when
//     the owner is ACKed, and the client asks again when the owner lands.
//
// The round waits for the most urgent of these and resends every kind that still has a name to
// resend. When every name is put in hold nothing is left to resend: the plan has no kinds and
// no delay (the host needs none). A request from a host that sends no causes (rejected is
// empty) is judged by rejected_names alone, without causes.
func planByCause(cfg Config, p Policy, rnd *source, failing []*pluginv1.FailingKind, delay time.Duration) causePlan {
	const (
		urgent = iota
		transient
		owner
		none
	)
	class := none
	var plan causePlan
	parked := 0
	for _, fk := range failing {
		left := len(fk.GetRejectedNames())
		if len(fk.GetRejected()) > 0 {
			left = 0
		}
		for _, rn := range fk.GetRejected() {
			switch rn.GetCause() {
			case kdsv1.Cause_CAUSE_INVALID:
				if n := invalidAttempts(rn); n >= cfg.invalidAttempts() {
					plan.hold = append(plan.hold, &pluginv1.HeldName{Kind: fk.GetKind(), Name: rn.GetName(),
						Reason: fmt.Sprintf("the client refused this content as invalid %d times; parked until it changes", n)})
					parked++
					continue
				}
				class = min(class, urgent)
			case kdsv1.Cause_CAUSE_TRANSIENT:
				class = min(class, transient)
			case kdsv1.Cause_CAUSE_MISSING_OWNER:
				class = min(class, owner)
			default:
				class = min(class, urgent)
			}
			left++
		}
		if len(fk.GetRejected()) == 0 && left > 0 {
			class = urgent // no causes: the policy as it is
		}
		if left > 0 {
			plan.kinds = append(plan.kinds, fk.GetKind())
		}
	}
	slices.Sort(plan.kinds)
	plan.kinds = slices.Compact(plan.kinds)
	switch class {
	case transient:
		limit := cfg.transientMax()
		if delay > limit/2 {
			delay = rnd.between(limit/2, limit)
		}
		plan.delay = max(delay, p.Floor())
		plan.why = fmt.Sprintf(", TRANSIENT: at most %s", limit)
	case owner:
		plan.delay = max(delay, min(cfg.ownerWait(), p.MaxDelay()))
		plan.why = ", MISSING_OWNER only: waiting for the owner"
	default:
		plan.delay = delay
	}
	if parked > 0 {
		plan.why += fmt.Sprintf(", %d INVALID parked", parked)
	}
	switch {
	case len(plan.kinds) == 0 && len(plan.hold) > 0:
		plan.delay = 0 // everything is parked: no round follows, and the host needs no delay
	case len(plan.kinds) == 0:
		plan.delay = p.MaxDelay() // no name at all (not what a host asks): the longest wait
	}
	return plan
}

// invalidAttempts is how often in a row the client refused rn's content as INVALID: its
// cause_attempts, or, from a host that predates that field, attempts (which counts the NACKs of
// every cause).
func invalidAttempts(rn *pluginv1.RejectedName) uint32 {
	if n := rn.GetCauseAttempts(); n > 0 {
		return n
	}
	return rn.GetAttempts()
}

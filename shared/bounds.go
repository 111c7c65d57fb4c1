package shared

import (
	"fmt"
	"time"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// Bounds are the limits a host holds every Schedule answer to, whatever the plugin declares.
// An answer outside them is refused whole: the host counts an error against the plugin, logs a
// WARN line naming the field and its value, and lets its built-in policy decide instead.
// docs/plugin-protocol.md (section "Host bounds") is the contract.
type Bounds struct {
	// MaxDelay is the longest delay the host accepts (kds-host --retry-max-delay, default
	// DefaultMaxDelay). Every delay must also be positive unless give_up is set.
	MaxDelay time.Duration
	// MaxReason is the longest reason the host accepts, in bytes: the schedule's reason and each
	// held name's (default DefaultMaxReason).
	MaxReason int
}

// Default bounds.
const (
	DefaultMaxDelay  = time.Hour
	DefaultMaxReason = 1024
)

// WithDefaults fills the zero fields of b with the defaults.
func (b Bounds) WithDefaults() Bounds {
	if b.MaxDelay <= 0 {
		b.MaxDelay = DefaultMaxDelay
	}
	if b.MaxReason <= 0 {
		b.MaxReason = DefaultMaxReason
	}
	return b
}

// BoundsError is a Schedule answer outside the host's bounds: which field, the value it had and
// the limit it broke.
type BoundsError struct {
	Field string
	Value string
	Limit string
}

func (e *BoundsError) Error() string {
	return fmt.Sprintf("the host refuses this schedule: %s %s %s", e.Field, e.Value, e.Limit)
}

// CheckSchedule holds resp, the answer to req, to the bounds (zero fields: the defaults). It
// returns nil or a *BoundsError:
//   - unless give_up is set, or hold names every rejected name of req (no round follows, and
//     the delay is ignored: see ParksAll), delay is a valid duration, positive and at most
//     MaxDelay;
//   - reason, and each held name's reason, are at most MaxReason bytes;
//   - kinds name only kinds of req.failing;
//   - hold names only rejected names of req.failing (kind and name).
func (b Bounds) CheckSchedule(req *pluginv1.ScheduleRequest, resp *pluginv1.ScheduleResponse) error {
	b = b.WithDefaults()
	if resp == nil {
		return &BoundsError{Field: "the answer", Value: "is empty", Limit: "(a ScheduleResponse is required)"}
	}
	if !resp.GetGiveUp() && !ParksAll(req, resp) {
		d := resp.GetDelay()
		switch {
		case d == nil:
			return &BoundsError{Field: "delay", Value: "is missing", Limit: "(it must be positive unless give_up is set)"}
		case d.CheckValid() != nil:
			return &BoundsError{Field: "delay", Value: fmt.Sprintf("{seconds: %d, nanos: %d}", d.GetSeconds(), d.GetNanos()), Limit: "is not a valid duration"}
		case d.AsDuration() <= 0:
			return &BoundsError{Field: "delay", Value: d.AsDuration().String(), Limit: "is not positive (it must be, unless give_up is set)"}
		case d.AsDuration() > b.MaxDelay:
			return &BoundsError{Field: "delay", Value: d.AsDuration().String(), Limit: fmt.Sprintf("is over the host's maximum of %s (--retry-max-delay)", b.MaxDelay)}
		}
	}
	if n := len(resp.GetReason()); n > b.MaxReason {
		return &BoundsError{Field: "reason", Value: fmt.Sprintf("of %d bytes", n), Limit: fmt.Sprintf("is over the host's maximum of %d bytes", b.MaxReason)}
	}
	failing := map[string]map[string]bool{}
	for _, f := range req.GetFailing() {
		names := map[string]bool{}
		for _, n := range f.GetRejectedNames() {
			names[n] = true
		}
		failing[f.GetKind()] = names
	}
	for i, k := range resp.GetKinds() {
		if _, ok := failing[k]; !ok {
			return &BoundsError{Field: fmt.Sprintf("kinds[%d]", i), Value: fmt.Sprintf("%q", k), Limit: "is not a failing kind of the request"}
		}
	}
	for i, h := range resp.GetHold() {
		if !failing[h.GetKind()][h.GetName()] {
			return &BoundsError{Field: fmt.Sprintf("hold[%d]", i), Value: fmt.Sprintf("%s %q", h.GetKind(), h.GetName()), Limit: "is not a rejected name of the request"}
		}
		if n := len(h.GetReason()); n > b.MaxReason {
			return &BoundsError{Field: fmt.Sprintf("hold[%d].reason", i), Value: fmt.Sprintf("of %d bytes", n), Limit: fmt.Sprintf("is over the host's maximum of %d bytes", b.MaxReason)}
		}
	}
	return nil
}

// ParksAll reports whether resp's hold names every rejected name of req: nothing of what the
// request asked about is left to resend, so no round follows and the host ignores the delay.
func ParksAll(req *pluginv1.ScheduleRequest, resp *pluginv1.ScheduleResponse) bool {
	if len(resp.GetHold()) == 0 {
		return false
	}
	held := make(map[[2]string]bool, len(resp.GetHold()))
	for _, h := range resp.GetHold() {
		held[[2]string{h.GetKind(), h.GetName()}] = true
	}
	for _, f := range req.GetFailing() {
		for _, n := range f.GetRejectedNames() {
			if !held[[2]string{f.GetKind(), n}] {
				return false
			}
		}
	}
	return true
}

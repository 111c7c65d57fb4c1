package guard

// Owner holds through a kds-host OwnerCheck plugin (Options.OwnerCheck): before a resource
// version goes to a client, the plugin is asked, once for every version a check finds without a
// verdict, off the stream's goroutine, and given up on at its deadline, or when the stream
// closes, even if it ignores its context (policy.Within; Guard.ownerAbandoned bounds what runs
// on).
//
// Invariants (under session.mu):
//   - A version the client does not hold goes to it only with an ACCEPT verdict of that version
//     (or the check failed: fail-open, everything asked is accepted).
//   - One check runs at a time per session; what needs a verdict meanwhile is asked next.
//   - A WAIT or REJECT verdict is asked again once the client ACKs something: what it holds
//     changed. One made by a check that started before the change is not kept at all: it
//     judged an inventory the client no longer has.
//   - A type's verdicts are of names in its view (served, and asked for): a name's verdict goes
//     when the name does, and all go when the stream closes.

import (
	"context"
	"time"

	"github.com/kds-host/kds-host/internal/shrink"
	"github.com/kds-host/kds-host/policy"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// ownerPending is the reason of a version the owner check has not judged yet.
const ownerPending = "waiting for the owner check"

// ownerVerdict is the plugin's verdict of one resource version.
type ownerVerdict struct {
	version string
	ok      bool
	reason  string
}

// ownerState is a session's owner checks; each type keeps its verdicts (typeState.verdicts).
type ownerState struct {
	waits   map[Ref]struct{} // the names whose verdict is WAIT or REJECT
	need    bool             // some version in a view has no verdict
	running bool             // a check is in flight
}

// ownerWithholdLocked says why the plugin keeps it from the client, or "": no verdict of its
// version yet, WAIT or REJECT. Call with s.mu.
func (s *session) ownerWithholdLocked(ts *typeState, it *item) string {
	if s.g.opts.OwnerCheck == nil {
		return ""
	}
	v, ok := ts.verdicts[it.name]
	switch {
	case !ok || v.version != it.version:
		s.owner.need = true
		return ownerPending
	case !v.ok:
		return "owner check: " + v.reason
	}
	return ""
}

// checkOwnersLocked starts a check when a view needs verdicts and none runs. Call with s.mu.
func (s *session) checkOwnersLocked() {
	if !s.owner.need || s.owner.running || s.g.opts.OwnerCheck == nil {
		return
	}
	s.owner.need, s.owner.running = false, true
	held := s.held // a check judges one inventory
	req := &pluginv1.PredictRequest{Zone: s.node}
	var asked []Ref
	var versions []string
	for typeURL, ts := range s.types {
		for n := range ts.acked.all() {
			req.Inventory = append(req.Inventory, &kdsv1.ResourceKey{Kind: typeURL, Name: n})
		}
		for _, it := range ts.served.all() {
			n := it.name
			if a := ts.acked.get(n); a != nil && a.version == it.version || !s.subscribedLocked(ts, n) {
				continue // the client holds it, or does not ask for it: no verdict to keep
			}
			c := &kdsv1.Resource{Kind: typeURL, Name: n}
			for _, ref := range it.refs {
				// Only what the client asks for can be waited for: an owner it does not ask
				// for is left out, as the guard's own holds leave it.
				if rts := s.types[ref.TypeURL]; rts != nil && s.subscribedLocked(rts, ref.Name) {
					c.Owners = append(c.Owners, &kdsv1.ResourceKey{Kind: ref.TypeURL, Name: ref.Name})
				}
			}
			req.Candidates = append(req.Candidates, c)
			asked = append(asked, Ref{TypeURL: typeURL, Name: n})
			versions = append(versions, it.version)
		}
	}
	check := s.g.opts.OwnerCheck()
	timeout := s.g.opts.OwnerCheckTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	s.wg.Go(func() {
		resp, err := policy.Within(s.ctx, &s.g.ownerAbandoned, timeout, func(ctx context.Context) (*pluginv1.PredictResponse, error) {
			return check.Predict(ctx, req)
		})
		preds := resp.GetPredictions()
		if err == nil && len(preds) != len(asked) {
			err = errWrongCount
		}
		s.mu.Lock()
		defer s.poke()
		defer s.mu.Unlock()
		s.owner.running = false
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			s.g.log.Warn("owner check failed: sending what it was asked about (fail-open)", "client", s.node, "error", err)
		}
		for i, ref := range asked {
			ts := s.types[ref.TypeURL]
			if ts.served.get(ref.Name) == nil || !s.subscribedLocked(ts, ref.Name) {
				continue // gone meanwhile
			}
			v := ownerVerdict{version: versions[i], ok: true}
			if err == nil && preds[i].GetVerdict() != pluginv1.Verdict_VERDICT_ACCEPT {
				if s.held != held {
					// The client's ACK meanwhile may be what it waited for, and the client may
					// send no other: left without a verdict, the version is asked again now.
					continue
				}
				v.ok, v.reason = false, preds[i].GetReason()
			}
			s.verdictLocked(ts, ref.Name, v)
		}
		for _, ref := range asked { // a version left without a verdict is asked about again
			if ts := s.types[ref.TypeURL]; ts != nil {
				markLocked(ts, ref.Name)
			}
		}
		for _, ts := range s.types {
			s.evaluateLocked(ts)
		}
	})
}

// ownerArrivedLocked forgets the verdicts that held something back: what the client holds
// changed, so they are asked again. It costs what they are. Call with s.mu.
func (s *session) ownerArrivedLocked() {
	s.held++
	for ref := range s.owner.waits {
		if ts := s.types[ref.TypeURL]; ts != nil {
			delete(ts.verdicts, ref.Name)
			ts.verdicts = shrink.Map(ts.verdicts, &ts.verdictsPeak)
			markLocked(ts, ref.Name)
		}
	}
	s.owner.waits = nil
}

// verdictLocked keeps v as the verdict of name. Call with s.mu.
func (s *session) verdictLocked(ts *typeState, name string, v ownerVerdict) {
	if ts.verdicts == nil {
		ts.verdicts = map[string]ownerVerdict{}
	}
	ts.verdicts[name] = v
	ts.verdicts = shrink.Map(ts.verdicts, &ts.verdictsPeak)
	ref := Ref{TypeURL: ts.typeURL, Name: name}
	if v.ok {
		delete(s.owner.waits, ref)
		return
	}
	if s.owner.waits == nil {
		s.owner.waits = map[Ref]struct{}{}
	}
	s.owner.waits[ref] = struct{}{}
}

// goneVerdictsLocked forgets the verdicts of the names that left the type's view: no longer
// served, or no longer asked for. It costs the verdicts the type has. Call with s.mu.
func (s *session) goneVerdictsLocked(ts *typeState) {
	for n := range ts.verdicts {
		if ts.served.get(n) == nil || !s.subscribedLocked(ts, n) {
			delete(ts.verdicts, n)
			delete(s.owner.waits, Ref{TypeURL: ts.typeURL, Name: n})
		}
	}
	ts.verdicts = shrink.Map(ts.verdicts, &ts.verdictsPeak)
}

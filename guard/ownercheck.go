package guard

// Owner holds through a kds-host OwnerCheck plugin (Options.OwnerCheck): before a resource
// version goes to a client, the plugin is asked, once for every version a check finds without a
// verdict, off the stream's goroutine.
//
// Invariants (under session.mu):
//   - A version the client does not hold goes to it only with an ACCEPT verdict of that version
//     (or the check failed: fail-open, everything asked is accepted).
//   - One check runs at a time per session; what needs a verdict meanwhile is asked next.
//   - A WAIT or REJECT verdict is asked again once the client ACKs something: what it holds
//     changed. One made by a check that started before the change is not kept at all: it
//     judged an inventory the client no longer has.

import (
	"context"
	"time"

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

// ownerState is a session's owner checks.
type ownerState struct {
	verdicts map[Ref]ownerVerdict
	need     bool // some version in a view has no verdict
	running  bool // a check is in flight
}

// ownerWithholdLocked says why the plugin keeps it from the client, or "": no verdict of its
// version yet, WAIT or REJECT. Call with s.mu.
func (s *session) ownerWithholdLocked(ts *typeState, it *item) string {
	if s.g.opts.OwnerCheck == nil {
		return ""
	}
	v, ok := s.owner.verdicts[Ref{TypeURL: ts.typeURL, Name: it.name}]
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
			if a := ts.acked.get(n); a != nil && a.version == it.version {
				continue
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
	policy := s.g.opts.OwnerCheck()
	timeout := s.g.opts.OwnerCheckTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	s.wg.Go(func() {
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		resp, err := policy.Predict(ctx, req)
		cancel()
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
		if s.owner.verdicts == nil {
			s.owner.verdicts = map[Ref]ownerVerdict{}
		}
		if err != nil {
			s.g.log.Warn("owner check failed: sending what it was asked about (fail-open)", "client", s.node, "error", err)
		}
		for i, ref := range asked {
			v := ownerVerdict{version: versions[i], ok: true}
			if err == nil && preds[i].GetVerdict() != pluginv1.Verdict_VERDICT_ACCEPT {
				if s.held != held {
					// The client's ACK meanwhile may be what it waited for, and the client may
					// send no other: left without a verdict, the version is asked again now.
					continue
				}
				v.ok, v.reason = false, preds[i].GetReason()
			}
			s.owner.verdicts[ref] = v
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
// changed, so they are asked again. Call with s.mu.
func (s *session) ownerArrivedLocked() {
	s.held++
	for ref, v := range s.owner.verdicts {
		if !v.ok {
			delete(s.owner.verdicts, ref)
			if ts := s.types[ref.TypeURL]; ts != nil {
				markLocked(ts, ref.Name)
			}
		}
	}
}

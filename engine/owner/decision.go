package owner

// The pure decision: what to ask the policy about one node, and what its answer decides.
//
// Invariants: nothing here does I/O or keeps state between calls; a Plan's candidates are the
// extra ones first, then every entry looked at that the node does not hold at its version, and a
// Decision gives each entry looked at exactly one verdict (held, or accepted at its version).

import (
	"errors"

	"github.com/kds-host/kds-host/engine"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// Verdict names, as Withheld.Verdict spells them.
const (
	Accept = "ACCEPT"
	Wait   = "WAIT"
	Reject = "REJECT"
)

// Withheld is one resource kept out of a node's view, or, in a check's answer, any verdict.
type Withheld struct {
	Key        engine.Ref `json:"key"`
	Verdict    string     `json:"verdict"`             // WAIT or REJECT (or ACCEPT, in a check)
	WaitingFor engine.Ref `json:"waitingFor,omitzero"` // the owner a WAIT waits for, if the policy named it
	Reason     string     `json:"reason,omitempty"`
}

// Verdict is the decision for one version of one resource on one node. It is kept for every
// node-resource, so it is small: an accepted one is its version alone.
type Verdict struct {
	Version  string
	Withheld *Withheld // why not; nil when accepted
}

// Accepted reports whether the node may see this version.
func (v Verdict) Accepted() bool { return v.Withheld == nil }

// visible is the version of the resource the node may see, or "" for none.
func (v Verdict) visible() string {
	if v.Withheld != nil {
		return ""
	}
	return v.Version
}

// Verdicts are one node's decisions, by key.
type Verdicts map[engine.Ref]Verdict

// View is what a node may see: the version of each key visible to it ("" for none).
type View interface {
	VisibleVersion(r engine.Ref) string
}

// VisibleVersion implements View.
func (v Verdicts) VisibleVersion(r engine.Ref) string { return v[r].visible() }

// Plan is one owner check of one node, as a pure decision: NewPlan says what to ask the policy,
// Decide reads its answer. The I/O (the Predict call) is the caller's.
type Plan struct {
	// Request is the Predict call to make: the extra candidates first, then every entry of the
	// snapshot that the node does not hold at its version; the node's inventory.
	Request *pluginv1.PredictRequest

	m       *Mapping
	extra   int             // how many of Request's candidates are extra
	entries []*engine.Entry // the snapshot's candidates, in Request order after the extra ones
	acked   []*engine.Entry // the snapshot's entries the node has ACKed at their version
}

// NewPlan plans the check of node, which has ACKed acked (type URL -> name -> version), against
// snap: every entry of the snapshot, and the node's whole inventory, put on the wire by m. The
// extra candidates (kds-host: a `kds-host check` file) are judged too, before the snapshot's,
// and replace the snapshot's entries of the same keys (m.RefOf of each).
func NewPlan(m Mapping, node string, snap *engine.Snapshot, acked map[string]map[string]string, extra []*kdsv1.Resource) *Plan {
	inExtra := make(map[engine.Ref]bool, len(extra))
	for _, r := range extra {
		inExtra[m.refOfCandidate(r)] = true
	}
	var entries []*engine.Entry
	for _, typeURL := range snap.Types() {
		for _, e := range snap.Type(typeURL) {
			if !inExtra[refOfEntry(e)] {
				entries = append(entries, e)
			}
		}
	}
	p := newPlan(&m, node, entries, extra, func(typeURL, name string) (string, bool) {
		v, ok := acked[typeURL][name]
		return v, ok
	})
	for typeURL, names := range acked {
		for name := range names {
			p.Request.Inventory = append(p.Request.Inventory, m.wireKey(engine.Ref{TypeURL: typeURL, Name: name}))
		}
	}
	return p
}

// NewPlanOf plans the check of the given entries for node, put on the wire by m: those the node
// has ACKed at their version (ackedVersion says) are accepted, the others are the candidates.
// The caller adds the inventory to Request.
func NewPlanOf(m Mapping, node string, entries []*engine.Entry, ackedVersion func(typeURL, name string) (string, bool)) *Plan {
	return newPlan(&m, node, entries, nil, ackedVersion)
}

func newPlan(m *Mapping, node string, entries []*engine.Entry, extra []*kdsv1.Resource, ackedVersion func(typeURL, name string) (string, bool)) *Plan {
	p := &Plan{Request: &pluginv1.PredictRequest{Zone: node}, m: m, extra: len(extra)}
	p.Request.Candidates = make([]*kdsv1.Resource, 0, len(extra)+len(entries))
	p.Request.Candidates = append(p.Request.Candidates, extra...)
	for _, e := range entries {
		if v, ok := ackedVersion(e.TypeURL, e.Name); ok && v == e.Version {
			p.acked = append(p.acked, e)
			continue
		}
		p.entries = append(p.entries, e)
		p.Request.Candidates = append(p.Request.Candidates, m.candidate(e))
	}
	return p
}

// Asks reports whether the plan has anything to ask the policy.
func (p *Plan) Asks() bool { return len(p.Request.Candidates) > 0 }

// Decision is what a check decided.
type Decision struct {
	// Withheld are the verdicts of the entries looked at that the node may not see (WAIT or
	// REJECT); every other entry looked at is in Accepted.
	Withheld Verdicts
	// Accepted are the entries looked at that the node may see, at their version.
	Accepted []*engine.Entry
	// Shown names, by type URL, the entries visible now at a version that was not visible before:
	// the node's view must be refreshed for those (and for no other: a hidden entry never makes
	// a response, so an entry hidden now needs no refresh).
	Shown map[string][]string
	// Extra is the verdict of each extra candidate, in order (ACCEPT, WAIT or REJECT).
	Extra []Withheld
	// Err is why the policy's answer could not be used; then every entry is accepted (the
	// check fails open) and Extra is empty.
	Err error
}

// Verdicts is the verdict of every entry looked at.
func (d Decision) Verdicts() Verdicts {
	out := make(Verdicts, len(d.Withheld)+len(d.Accepted))
	for k, v := range d.Withheld {
		out[k] = v
	}
	for _, e := range d.Accepted {
		out[refOfEntry(e)] = Verdict{Version: e.Version}
	}
	return out
}

// Decide reads the policy's answer to Request (err: the call failed) against what the node
// could see before (prev; nil: nothing).
func (p *Plan) Decide(prev View, resp *pluginv1.PredictResponse, err error) Decision {
	d := p.decide(resp, err)
	d.Shown = shown(d.Accepted, prev)
	return d
}

// decide is Decide without Shown, which depends on the node's view: the same decision serves
// every node that asked the same (Holds shares it).
func (p *Plan) decide(resp *pluginv1.PredictResponse, err error) Decision {
	if err == nil && p.Asks() && len(resp.GetPredictions()) != len(p.Request.Candidates) {
		err = errors.New("owner check answered a different number of predictions")
	}
	d := Decision{Withheld: Verdicts{}, Accepted: make([]*engine.Entry, 0, len(p.acked)+len(p.entries)), Err: err}
	d.Accepted = append(d.Accepted, p.acked...) // already there
	preds := resp.GetPredictions()
	for i, e := range p.entries {
		if err == nil {
			if h := p.withheldOf(preds[p.extra+i], refOfEntry(e)); h.Verdict != Accept {
				d.Withheld[h.Key] = Verdict{Version: e.Version, Withheld: &h}
				continue
			}
		}
		d.Accepted = append(d.Accepted, e)
	}
	if err == nil {
		for i := range p.extra {
			c := p.Request.Candidates[i]
			d.Extra = append(d.Extra, p.withheldOf(preds[i], p.m.refOfCandidate(c)))
		}
	}
	return d
}

// shown names, by type URL, the accepted entries whose version prev did not show.
func shown(accepted []*engine.Entry, prev View) map[string][]string {
	out := map[string][]string{}
	for _, e := range accepted {
		if prev == nil || prev.VisibleVersion(refOfEntry(e)) != e.Version {
			out[e.TypeURL] = append(out[e.TypeURL], e.Name)
		}
	}
	return out
}

// withheldOf reads one prediction about key.
func (p *Plan) withheldOf(pr *pluginv1.Prediction, key engine.Ref) Withheld {
	h := Withheld{Key: key, Verdict: Accept, Reason: pr.GetReason()}
	switch pr.GetVerdict() {
	case pluginv1.Verdict_VERDICT_WAIT:
		h.Verdict = Wait
		if w := pr.GetWaitingFor(); w != nil {
			h.WaitingFor = p.m.refOf(w)
		}
	case pluginv1.Verdict_VERDICT_REJECT:
		h.Verdict = Reject
	}
	return h
}

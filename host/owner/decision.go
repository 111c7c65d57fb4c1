package owner

// The pure decision: what to ask the policy about one zone, and what its answer decides.
//
// Invariants: nothing here does I/O or keeps state between calls; a Plan's candidates are the
// extra ones first, then every entry looked at that the zone does not hold at its version, and a
// Decision gives each entry looked at exactly one verdict (held, or accepted at its version).

import (
	"errors"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// Verdict names, as Withheld.Verdict spells them.
const (
	Accept = "ACCEPT"
	Wait   = "WAIT"
	Reject = "REJECT"
)

// Withheld is one resource kept out of a zone's view, or, in a check's answer, any verdict.
type Withheld struct {
	Key        resource.Key `json:"key"`
	Verdict    string       `json:"verdict"` // WAIT or REJECT (or ACCEPT, in a check)
	WaitingFor string       `json:"waitingFor,omitempty"`
	Reason     string       `json:"reason,omitempty"`
}

// Verdict is the decision for one version of one resource on one zone. It is kept for every
// zone-resource, so it is small: an accepted one is its version alone.
type Verdict struct {
	Version  string
	Withheld *Withheld // why not; nil when accepted
}

// Accepted reports whether the zone may see this version.
func (v Verdict) Accepted() bool { return v.Withheld == nil }

// visible is the version of the resource the zone may see, or "" for none.
func (v Verdict) visible() string {
	if v.Withheld != nil {
		return ""
	}
	return v.Version
}

// Verdicts are one zone's decisions, by key.
type Verdicts map[resource.Key]Verdict

// View is what a zone may see: the version of each key visible to it ("" for none).
type View interface {
	VisibleVersion(k resource.Key) string
}

// VisibleVersion implements View.
func (v Verdicts) VisibleVersion(k resource.Key) string { return v[k].visible() }

// Plan is one owner check of one zone, as a pure decision: NewPlan says what to ask the policy,
// Decide reads its answer. The I/O (the Predict call) is the caller's.
type Plan struct {
	// Request is the Predict call to make: the extra candidates first, then every entry of the
	// snapshot that the zone does not hold at its version; the zone's inventory.
	Request *pluginv1.PredictRequest

	extra   int             // how many of Request's candidates are extra
	entries []*engine.Entry // the snapshot's candidates, in Request order after the extra ones
	acked   []*engine.Entry // the snapshot's entries the zone has ACKed at their version
}

// NewPlan plans the check of zone, which has ACKed acked (kind -> xDS name -> version), against
// snap: every entry of the snapshot, and the zone's whole inventory. The extra candidates (a
// `kds-host check` file) are judged too, before the snapshot's, and replace the snapshot's
// entries of the same keys.
func NewPlan(zone string, snap *engine.Snapshot, acked map[string]map[string]string, extra []*kdsv1.Resource) *Plan {
	inExtra := make(map[resource.Key]bool, len(extra))
	for _, r := range extra {
		inExtra[resource.Key{Kind: r.GetKind(), Mesh: r.GetMesh(), Name: r.GetName()}] = true
	}
	var entries []*engine.Entry
	for _, kind := range snap.Types() {
		for _, e := range snap.Type(kind) {
			if !inExtra[kds.KeyOf(e)] {
				entries = append(entries, e)
			}
		}
	}
	p := newPlan(zone, entries, extra, func(kind, name string) (string, bool) {
		v, ok := acked[kind][name]
		return v, ok
	})
	for kind, names := range acked {
		for name := range names {
			k := resource.KeyFromXDSName(kind, name)
			p.Request.Inventory = append(p.Request.Inventory, &kdsv1.ResourceKey{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name})
		}
	}
	return p
}

// NewPlanOf plans the check of the given entries for zone: those the zone has ACKed at their
// version (ackedVersion says) are accepted, the others are the candidates. The caller adds the inventory
// to Request.
func NewPlanOf(zone string, entries []*engine.Entry, ackedVersion func(kind, name string) (string, bool)) *Plan {
	return newPlan(zone, entries, nil, ackedVersion)
}

func newPlan(zone string, entries []*engine.Entry, extra []*kdsv1.Resource, ackedVersion func(kind, name string) (string, bool)) *Plan {
	p := &Plan{Request: &pluginv1.PredictRequest{Zone: zone}, extra: len(extra)}
	p.Request.Candidates = make([]*kdsv1.Resource, 0, len(extra)+len(entries))
	p.Request.Candidates = append(p.Request.Candidates, extra...)
	for _, e := range entries {
		if v, ok := ackedVersion(kds.KeyOf(e).Kind, e.Name); ok && v == e.Version {
			p.acked = append(p.acked, e)
			continue
		}
		p.entries = append(p.entries, e)
		p.Request.Candidates = append(p.Request.Candidates, kds.ResourceOf(e))
	}
	return p
}

// Asks reports whether the plan has anything to ask the policy.
func (p *Plan) Asks() bool { return len(p.Request.Candidates) > 0 }

// Decision is what a check decided.
type Decision struct {
	// Withheld are the verdicts of the entries looked at that the zone may not see (WAIT or
	// REJECT); every other entry looked at is in Accepted.
	Withheld Verdicts
	// Accepted are the entries looked at that the zone may see, at their version.
	Accepted []*engine.Entry
	// Shown names, by kind, the entries visible now at a version that was not visible before:
	// the zone's view must be refreshed for those (and for no other: a hidden entry never makes
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
		out[kds.KeyOf(e)] = Verdict{Version: e.Version}
	}
	return out
}

// Decide reads the policy's answer to Request (err: the call failed) against what the zone
// could see before (prev; nil: nothing).
func (p *Plan) Decide(prev View, resp *pluginv1.PredictResponse, err error) Decision {
	d := p.decide(resp, err)
	d.Shown = shown(d.Accepted, prev)
	return d
}

// decide is Decide without Shown, which depends on the zone's view: the same decision serves
// every zone that asked the same (Holds shares it).
func (p *Plan) decide(resp *pluginv1.PredictResponse, err error) Decision {
	if err == nil && p.Asks() && len(resp.GetPredictions()) != len(p.Request.Candidates) {
		err = errors.New("owner check answered a different number of predictions")
	}
	d := Decision{Withheld: Verdicts{}, Accepted: make([]*engine.Entry, 0, len(p.acked)+len(p.entries)), Err: err}
	d.Accepted = append(d.Accepted, p.acked...) // already there
	preds := resp.GetPredictions()
	for i, e := range p.entries {
		if err == nil {
			if h := withheldOf(preds[p.extra+i], kds.KeyOf(e)); h.Verdict != Accept {
				d.Withheld[kds.KeyOf(e)] = Verdict{Version: e.Version, Withheld: &h}
				continue
			}
		}
		d.Accepted = append(d.Accepted, e)
	}
	if err == nil {
		for i := range p.extra {
			c := p.Request.Candidates[i]
			d.Extra = append(d.Extra, withheldOf(preds[i], resource.Key{Kind: c.GetKind(), Mesh: c.GetMesh(), Name: c.GetName()}))
		}
	}
	return d
}

// shown names, by kind, the accepted entries whose version prev did not show.
func shown(accepted []*engine.Entry, prev View) map[string][]string {
	out := map[string][]string{}
	visible := func(e *engine.Entry) string { return prev.VisibleVersion(kds.KeyOf(e)) }
	if z, ok := prev.(*zoneHolds); ok {
		visible = z.visibleEntry // no xDS name to build
	}
	for _, e := range accepted {
		if prev == nil || visible(e) != e.Version {
			out[kds.KeyOf(e).Kind] = append(out[kds.KeyOf(e).Kind], e.Name)
		}
	}
	return out
}

// withheldOf reads one prediction about key.
func withheldOf(p *pluginv1.Prediction, key resource.Key) Withheld {
	h := Withheld{Key: key, Verdict: Accept, Reason: p.GetReason()}
	switch p.GetVerdict() {
	case pluginv1.Verdict_VERDICT_WAIT:
		h.Verdict = Wait
		if w := p.GetWaitingFor(); w != nil {
			h.WaitingFor = resource.Key{Kind: w.GetKind(), Mesh: w.GetMesh(), Name: w.GetName()}.String()
		}
	case pluginv1.Verdict_VERDICT_REJECT:
		h.Verdict = Reject
	}
	return h
}

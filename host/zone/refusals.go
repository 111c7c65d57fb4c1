package zone

import (
	"slices"

	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// refusals is what a zone refused on its current stream, and why: so that it can ask for those
// names again the moment their cause clears (its admission of the kind is ready again; the owner
// they missed is stored). INVALID names are remembered but never asked for again: the same
// content cannot help. It is plain state, owned by the stream's goroutine.
type refusals struct {
	byKind map[string]map[string]refusal // kind -> xDS name -> why
}

type refusal struct {
	cause kdsv1.Cause
	owner resource.Key // with CAUSE_MISSING_OWNER
}

func newRefusals() *refusals { return &refusals{byKind: map[string]map[string]refusal{}} }

// refused records the rejections of a response of kind.
func (r *refusals) refused(kind string, rejections []*kdsv1.Rejection) {
	if len(rejections) == 0 {
		return
	}
	names := r.byKind[kind]
	if names == nil {
		names = map[string]refusal{}
		r.byKind[kind] = names
	}
	for _, rj := range rejections {
		rf := refusal{cause: rj.GetCause()}
		if mo := rj.GetMissingOwner(); mo != nil {
			rf.owner = resource.Key{Kind: mo.GetKind(), Mesh: mo.GetMesh(), Name: mo.GetName()}
		}
		names[rj.GetName()] = rf
	}
}

// settled forgets names of kind the zone now stores, or no longer has to.
func (r *refusals) settled(kind string, names []string) {
	m := r.byKind[kind]
	for _, n := range names {
		delete(m, n)
	}
	if len(m) == 0 {
		delete(r.byKind, kind)
	}
}

// admissionReady returns, and forgets, the names of kind refused as TRANSIENT: the zone's
// admission of kind is ready again.
func (r *refusals) admissionReady(kind string) []string {
	var out []string
	for name, rf := range r.byKind[kind] {
		if rf.cause == kdsv1.Cause_CAUSE_TRANSIENT {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	r.settled(kind, out)
	return out
}

// ownersStored returns, and forgets, the names (by kind) that missed one of the owners now
// stored.
func (r *refusals) ownersStored(owners []resource.Key) map[string][]string {
	if len(owners) == 0 {
		return nil
	}
	stored := make(map[resource.Key]bool, len(owners))
	for _, k := range owners {
		stored[k] = true
	}
	out := map[string][]string{}
	for kind, names := range r.byKind {
		for name, rf := range names {
			if rf.cause == kdsv1.Cause_CAUSE_MISSING_OWNER && stored[rf.owner] {
				out[kind] = append(out[kind], name)
			}
		}
	}
	for kind, names := range out {
		slices.Sort(names)
		r.settled(kind, names)
	}
	return out
}

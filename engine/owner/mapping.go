package owner

// How the snapshot's entries go on the OwnerCheck plugin's wire, and its keys come back.
//
// Invariants: a Mapping's methods give its field's answer, or the default when the field is
// nil; they keep no state, so one Mapping serves every check at once.

import (
	"github.com/kds-host/kds-host/engine"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// Mapping is how Holds and Plan put the snapshot's entries on the OwnerCheck plugin's wire
// (a candidate is a kdsv1.Resource, a key a kdsv1.ResourceKey) and read the plugin's keys back.
// A nil field takes its default, which suits any xDS server: a candidate's kind (the wire's field)
// is its type URL, its name the resource's name, its mesh empty, and its owners the references it
// names. kds-host passes its own, which puts the mesh of a mesh-scoped name ("mesh/name") in the
// wire's mesh.
type Mapping struct {
	// Candidate is the resource the policy is asked about for an entry. Default: e.Source when
	// it is a *kdsv1.Resource, else a resource of kind e.TypeURL and name e.Name, with no owners.
	Candidate func(e *engine.Entry) *kdsv1.Resource
	// Owners are what an entry waits for: a verdict that holds it back is checked again when one
	// of them changes or reaches the node, and one that shows it when the node removes one.
	// Default: the candidate's owners, each read by RefOf.
	Owners func(e *engine.Entry) []engine.Ref
	// WireKey is a resource's key on the wire (a request's inventory). Default: the kind is the
	// type URL, the name the resource's name, the mesh empty.
	WireKey func(r engine.Ref) *kdsv1.ResourceKey
	// RefOf reads a key of the wire back (a candidate's owners and key, a prediction's
	// waiting_for). Default: the type URL is the kind, and the name the key's name, or
	// "mesh/name" when the key has a mesh.
	RefOf func(k *kdsv1.ResourceKey) engine.Ref
}

// candidate is Candidate's answer, or its default.
func (m *Mapping) candidate(e *engine.Entry) *kdsv1.Resource {
	if m.Candidate != nil {
		return m.Candidate(e)
	}
	if r, ok := e.Source.(*kdsv1.Resource); ok {
		return r
	}
	return &kdsv1.Resource{Kind: e.TypeURL, Name: e.Name}
}

// owners is Owners's answer, or its default.
func (m *Mapping) owners(e *engine.Entry) []engine.Ref {
	if m.Owners != nil {
		return m.Owners(e)
	}
	var c *kdsv1.Resource
	if m.Candidate != nil {
		c = m.Candidate(e)
	} else {
		c, _ = e.Source.(*kdsv1.Resource) // the default candidate of any other names no owner
	}
	return m.refsOf(c.GetOwners())
}

// refsOf reads keys of the wire back (RefOf), nil for none.
func (m *Mapping) refsOf(keys []*kdsv1.ResourceKey) []engine.Ref {
	if len(keys) == 0 {
		return nil
	}
	out := make([]engine.Ref, 0, len(keys))
	for _, k := range keys {
		out = append(out, m.refOf(k))
	}
	return out
}

// wireKey is WireKey's answer, or its default.
func (m *Mapping) wireKey(r engine.Ref) *kdsv1.ResourceKey {
	if m.WireKey != nil {
		return m.WireKey(r)
	}
	return &kdsv1.ResourceKey{Kind: r.TypeURL, Name: r.Name}
}

// refOf is RefOf's answer, or its default.
func (m *Mapping) refOf(k *kdsv1.ResourceKey) engine.Ref {
	if m.RefOf != nil {
		return m.RefOf(k)
	}
	if k.GetMesh() != "" {
		return engine.Ref{TypeURL: k.GetKind(), Name: k.GetMesh() + "/" + k.GetName()}
	}
	return engine.Ref{TypeURL: k.GetKind(), Name: k.GetName()}
}

// refOfCandidate is the key a candidate of the wire is judged under (an extra candidate).
func (m *Mapping) refOfCandidate(r *kdsv1.Resource) engine.Ref {
	return m.refOf(&kdsv1.ResourceKey{Kind: r.GetKind(), Mesh: r.GetMesh(), Name: r.GetName()})
}

// refOfEntry is the key an entry is judged under: its type URL and name.
func refOfEntry(e *engine.Entry) engine.Ref { return engine.Ref{TypeURL: e.TypeURL, Name: e.Name} }

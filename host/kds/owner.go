package kds

// kds-host's resources on the owner check's wire (engine/owner.Mapping): the candidate is the
// entry's kds.v1 resource (ResourceOf), a key's mesh apart from its name.

import (
	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// RefOf is a key's Ref: its kind, and its xDS name ("mesh/name" for a mesh-scoped resource).
func RefOf(k resource.Key) engine.Ref { return engine.Ref{TypeURL: k.Kind, Name: k.XDSName()} }

// OwnersOf are what an entry kds-host built waits for: its Mesh, when it is mesh-scoped, and its
// explicit owners.
func OwnersOf(e *engine.Entry) []engine.Ref {
	r := ResourceOf(e)
	var out []engine.Ref
	if r.GetMesh() != "" {
		out = append(out, engine.Ref{TypeURL: resource.MeshKind, Name: r.GetMesh()})
	}
	for _, o := range r.GetOwners() {
		out = append(out, RefOfWireKey(o))
	}
	return out
}

// WireKeyOf is a Ref as kds-host's wire keys it: the mesh of a mesh-scoped name apart.
func WireKeyOf(r engine.Ref) *kdsv1.ResourceKey {
	k := resource.KeyFromXDSName(r.TypeURL, r.Name)
	return &kdsv1.ResourceKey{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name}
}

// RefOfWireKey is the Ref of a key of kds-host's wire (WireKeyOf's inverse).
func RefOfWireKey(k *kdsv1.ResourceKey) engine.Ref {
	return RefOf(resource.Key{Kind: k.GetKind(), Mesh: k.GetMesh(), Name: k.GetName()})
}

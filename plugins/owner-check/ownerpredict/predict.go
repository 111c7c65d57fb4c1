// Package ownerpredict is kds-host's reference owner check: it predicts which resources a zone
// would reject because an owner (its Mesh, or an explicit owner reference) is missing there.
package ownerpredict

import (
	"context"
	"fmt"
	"slices"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Name is the name a Predictor gives in Describe.
const Name = "owner-check"

// Version is the version of the reference owner check.
const Version = "0.1.0"

// MeshKind is the kind that owns every mesh-scoped resource.
const MeshKind = "Mesh"

var capabilities = []string{"mesh-owner", "explicit-owner"}

// Predictor is the reference shared.OwnerCheck. For each candidate it walks the owners (its Mesh
// when the candidate is mesh-scoped, then its explicit owners, in order):
//   - an owner the zone has (in the inventory) is fine;
//   - an owner that is itself a candidate means WAIT for it;
//   - an owner that is neither means REJECT: it exists neither on the zone nor on the global.
//
// A REJECT on any owner wins over a WAIT, since waiting would not help; otherwise the first
// missing owner is the one waited for. With every owner present the verdict is ACCEPT. The zero
// Predictor is ready to use, holds no state, and is safe for concurrent use.
type Predictor struct{}

var _ shared.OwnerCheck = (*Predictor)(nil)

// New returns a Predictor.
func New() *Predictor { return &Predictor{} }

// Describe names the plugin and its capabilities.
func (*Predictor) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{
		Name:         Name,
		Version:      Version,
		Capabilities: slices.Clone(capabilities),
		// A mesh-scoped resource waits for its Mesh; explicit owners come with the candidates.
		OwnerKinds: []string{MeshKind},
		// An answer is the candidates' and the inventory's alone.
		ZoneIndependent: true,
	}, nil
}

// key is a ResourceKey usable as a map key.
type key struct{ kind, mesh, name string }

func keyOf(k *kdsv1.ResourceKey) key { return key{k.GetKind(), k.GetMesh(), k.GetName()} }

func (k key) proto() *kdsv1.ResourceKey {
	return &kdsv1.ResourceKey{Kind: k.kind, Mesh: k.mesh, Name: k.name}
}

// String reads "Mesh default" or "MeshTimeout t1 in mesh default".
func (k key) String() string {
	if k.mesh == "" {
		return k.kind + " " + k.name
	}
	return fmt.Sprintf("%s %s in mesh %s", k.kind, k.name, k.mesh)
}

// Predict returns one prediction per candidate, in order. Its cost is linear in the number of
// candidates, inventory items and owner references.
func (*Predictor) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	candidates, inventory := req.GetCandidates(), req.GetInventory()
	if len(candidates) == 0 {
		return &pluginv1.PredictResponse{}, nil
	}
	if err := validate(candidates, inventory); err != nil {
		return nil, err
	}

	present := make(map[key]struct{}, len(inventory))
	for _, k := range inventory {
		present[keyOf(k)] = struct{}{}
	}
	pending := make(map[key]struct{}, len(candidates))
	for _, c := range candidates {
		pending[key{c.GetKind(), c.GetMesh(), c.GetName()}] = struct{}{}
	}

	// One allocation for all predictions, one for all their keys.
	preds := make([]pluginv1.Prediction, len(candidates))
	keys := make([]kdsv1.ResourceKey, len(candidates))
	out := make([]*pluginv1.Prediction, len(candidates))
	var owners []key
	for i, c := range candidates {
		keys[i] = kdsv1.ResourceKey{Kind: c.GetKind(), Mesh: c.GetMesh(), Name: c.GetName()}
		p := &preds[i]
		p.Key = &keys[i]
		p.Verdict = pluginv1.Verdict_VERDICT_ACCEPT

		owners = owners[:0]
		if c.GetMesh() != "" {
			owners = append(owners, key{kind: MeshKind, name: c.GetMesh()})
		}
		for _, o := range c.GetOwners() {
			owners = append(owners, keyOf(o))
		}
		for _, o := range owners {
			if _, ok := present[o]; ok {
				continue
			}
			if _, ok := pending[o]; !ok {
				p.Verdict = pluginv1.Verdict_VERDICT_REJECT
				p.WaitingFor = nil
				p.Reason = fmt.Sprintf("owner %s exists neither on the zone nor on the global", o)
				break
			}
			if p.Verdict == pluginv1.Verdict_VERDICT_ACCEPT {
				p.Verdict = pluginv1.Verdict_VERDICT_WAIT
				p.WaitingFor = o.proto()
				p.Reason = "waiting for " + o.String()
			}
		}
		out[i] = p
	}
	return &pluginv1.PredictResponse{Predictions: out}, nil
}

// validate checks that every candidate, owner reference and inventory key names a resource.
// Field names are formatted only for an error: this runs over every item of a large batch.
func validate(candidates []*kdsv1.Resource, inventory []*kdsv1.ResourceKey) error {
	for i, c := range candidates {
		switch {
		case c == nil:
			return shared.InvalidArgument(fmt.Sprintf("candidates[%d]", i), "must be set")
		case c.GetKind() == "":
			return shared.InvalidArgument(fmt.Sprintf("candidates[%d].kind", i), "must not be empty")
		case c.GetName() == "":
			return shared.InvalidArgument(fmt.Sprintf("candidates[%d].name", i), "must not be empty")
		}
		for j, o := range c.GetOwners() {
			if sub, detail, ok := checkKey(o); !ok {
				return shared.InvalidArgument(fmt.Sprintf("candidates[%d].owners[%d]%s", i, j, sub), "%s", detail)
			}
		}
	}
	for i, k := range inventory {
		if sub, detail, ok := checkKey(k); !ok {
			return shared.InvalidArgument(fmt.Sprintf("inventory[%d]%s", i, sub), "%s", detail)
		}
	}
	return nil
}

// checkKey says what is wrong with k: the sub-field (".kind", ".name", or "" for a nil key) and
// a detail; ok is true for a good key.
func checkKey(k *kdsv1.ResourceKey) (sub, detail string, ok bool) {
	switch {
	case k == nil:
		return "", "must be set", false
	case k.GetKind() == "":
		return ".kind", "must not be empty", false
	case k.GetName() == "":
		return ".name", "must not be empty", false
	}
	return "", "", true
}

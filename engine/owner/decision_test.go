package owner_test

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

var (
	meshKey    = resource.Key{Kind: "Mesh", Name: "default"}
	timeoutKey = resource.Key{Kind: "MeshTimeout", Mesh: "default", Name: "t"}
	retryKey   = resource.Key{Kind: "MeshRetry", Mesh: "default", Name: "r"}
)

// ref is a key's Ref, as kds-host's entries are judged under it.
var ref = kds.RefOf

func snapshot(t testing.TB, keys ...resource.Key) *engine.Snapshot {
	t.Helper()
	var rs []resource.Resource
	for _, k := range keys {
		rs = append(rs, resource.Resource{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name, Generation: 1})
	}
	var b kds.SnapshotBuilder
	s, err := b.Build(rs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// version is the version a snapshot serves for key.
func version(s *engine.Snapshot, k resource.Key) string { return s.Type(k.Kind)[k.XDSName()].Version }

// holding is a zone inventory: each key at the snapshot's version, or at "old".
func holding(s *engine.Snapshot, current []resource.Key, old ...resource.Key) map[string]map[string]string {
	out := map[string]map[string]string{}
	add := func(k resource.Key, v string) {
		if out[k.Kind] == nil {
			out[k.Kind] = map[string]string{}
		}
		out[k.Kind][k.XDSName()] = v
	}
	for _, k := range current {
		add(k, version(s, k))
	}
	for _, k := range old {
		add(k, "old")
	}
	return out
}

// answer is a policy's answer to the plan's request: the verdict of each candidate by key,
// ACCEPT for the others.
func answer(p *owner.Plan, verdicts map[resource.Key]pluginv1.Verdict) *pluginv1.PredictResponse {
	resp := &pluginv1.PredictResponse{}
	for _, c := range p.Request.GetCandidates() {
		k := resource.Key{Kind: c.GetKind(), Mesh: c.GetMesh(), Name: c.GetName()}
		v, ok := verdicts[k]
		if !ok {
			v = pluginv1.Verdict_VERDICT_ACCEPT
		}
		pr := &pluginv1.Prediction{Key: &kdsv1.ResourceKey{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name}, Verdict: v, Reason: "because"}
		if v == pluginv1.Verdict_VERDICT_WAIT {
			pr.WaitingFor = &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}
		}
		resp.Predictions = append(resp.Predictions, pr)
	}
	return resp
}

func candidates(p *owner.Plan) []resource.Key {
	var out []resource.Key
	for _, c := range p.Request.GetCandidates() {
		out = append(out, resource.Key{Kind: c.GetKind(), Mesh: c.GetMesh(), Name: c.GetName()})
	}
	return out
}

func accepted(s *engine.Snapshot, k resource.Key) owner.Verdict {
	return owner.Verdict{Version: version(s, k)}
}

func TestOwnerDecision(t *testing.T) {
	snap := snapshot(t, meshKey, timeoutKey, retryKey)
	waitMesh := func(k resource.Key) owner.Verdict {
		return owner.Verdict{Version: version(snap, k), Withheld: &owner.Withheld{Key: ref(k), Verdict: owner.Wait, WaitingFor: engine.Ref{TypeURL: "Mesh", Name: "default"}, Reason: "because"}}
	}
	for _, tc := range []struct {
		name           string
		held           map[string]map[string]string
		prev           owner.Verdicts
		extra          []*kdsv1.Resource
		verdicts       map[resource.Key]pluginv1.Verdict
		err            error
		wantCandidates []resource.Key
		wantVerdicts   owner.Verdicts
		wantShown      map[string][]string
		wantExtra      []owner.Withheld
		wantErr        bool
	}{
		{
			name:           "an empty zone: policies wait for their Mesh, the Mesh is shown",
			verdicts:       map[resource.Key]pluginv1.Verdict{timeoutKey: pluginv1.Verdict_VERDICT_WAIT, retryKey: pluginv1.Verdict_VERDICT_WAIT},
			wantCandidates: []resource.Key{meshKey, retryKey, timeoutKey},
			wantVerdicts:   owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(timeoutKey): waitMesh(timeoutKey), ref(retryKey): waitMesh(retryKey)},
			wantShown:      map[string][]string{"Mesh": {"default"}},
		},
		{
			name:           "the Mesh is there: it is no candidate, and what waited is shown",
			held:           holding(snap, []resource.Key{meshKey}),
			prev:           owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(timeoutKey): waitMesh(timeoutKey), ref(retryKey): waitMesh(retryKey)},
			wantCandidates: []resource.Key{retryKey, timeoutKey},
			wantVerdicts:   owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(timeoutKey): accepted(snap, timeoutKey), ref(retryKey): accepted(snap, retryKey)},
			wantShown:      map[string][]string{"MeshRetry": {"default/r"}, "MeshTimeout": {"default/t"}},
		},
		{
			name:           "an older version held is a candidate; a version visible before is not shown again",
			held:           holding(snap, []resource.Key{meshKey, retryKey}, timeoutKey),
			prev:           owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(retryKey): accepted(snap, retryKey), ref(timeoutKey): accepted(snap, timeoutKey)},
			wantCandidates: []resource.Key{timeoutKey},
			wantVerdicts:   owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(timeoutKey): accepted(snap, timeoutKey), ref(retryKey): accepted(snap, retryKey)},
			wantShown:      map[string][]string{},
		},
		{
			name:           "the policy failed: everything is accepted (fail-open)",
			err:            errors.New("plugin down"),
			wantCandidates: []resource.Key{meshKey, retryKey, timeoutKey},
			wantVerdicts:   owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(timeoutKey): accepted(snap, timeoutKey), ref(retryKey): accepted(snap, retryKey)},
			wantShown:      map[string][]string{"Mesh": {"default"}, "MeshRetry": {"default/r"}, "MeshTimeout": {"default/t"}},
			wantErr:        true,
		},
		{
			name: "extra candidates come first, replace the snapshot's entry of their key, and are answered in order",
			extra: []*kdsv1.Resource{
				{Kind: "MeshTimeout", Mesh: "default", Name: "t"},
				{Kind: "MeshTimeout", Mesh: "other", Name: "x"},
			},
			verdicts: map[resource.Key]pluginv1.Verdict{
				{Kind: "MeshTimeout", Mesh: "other", Name: "x"}: pluginv1.Verdict_VERDICT_REJECT,
				retryKey: pluginv1.Verdict_VERDICT_WAIT,
			},
			wantCandidates: []resource.Key{timeoutKey, {Kind: "MeshTimeout", Mesh: "other", Name: "x"}, meshKey, retryKey},
			wantVerdicts:   owner.Verdicts{ref(meshKey): accepted(snap, meshKey), ref(retryKey): waitMesh(retryKey)},
			wantShown:      map[string][]string{"Mesh": {"default"}},
			wantExtra: []owner.Withheld{
				{Key: ref(timeoutKey), Verdict: owner.Accept, Reason: "because"},
				{Key: ref(resource.Key{Kind: "MeshTimeout", Mesh: "other", Name: "x"}), Verdict: owner.Reject, Reason: "because"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			plan := owner.NewPlan(owner.KDSMapping, "zone-1", snap, tc.held, tc.extra)
			got := candidates(plan)
			g.Expect(got[:len(tc.extra)]).To(Equal(tc.wantCandidates[:len(tc.extra)]), "extra candidates first, in order")
			g.Expect(got).To(ConsistOf(tc.wantCandidates))
			g.Expect(plan.Request.GetInventory()).To(HaveLen(func() int {
				n := 0
				for _, names := range tc.held {
					n += len(names)
				}
				return n
			}()))
			var resp *pluginv1.PredictResponse
			if tc.err == nil {
				resp = answer(plan, tc.verdicts)
			}
			d := plan.Decide(tc.prev, resp, tc.err)
			g.Expect(d.Err != nil).To(Equal(tc.wantErr))
			g.Expect(d.Verdicts()).To(Equal(tc.wantVerdicts))
			g.Expect(d.Shown).To(Equal(tc.wantShown))
			g.Expect(d.Extra).To(Equal(tc.wantExtra))
		})
	}
}

func TestOwnerDecisionRefusesAShortAnswer(t *testing.T) {
	g := NewWithT(t)
	snap := snapshot(t, meshKey, timeoutKey)
	plan := owner.NewPlan(owner.KDSMapping, "zone-1", snap, nil, nil)
	resp := answer(plan, nil)
	resp.Predictions = resp.Predictions[:1]
	d := plan.Decide(nil, resp, nil)
	g.Expect(d.Err).To(MatchError(ContainSubstring("different number of predictions")))
	g.Expect(d.Verdicts()).To(HaveLen(2), "failed open: both accepted")
	g.Expect(d.Verdicts()[ref(timeoutKey)].Accepted()).To(BeTrue())
}

func TestOwnerDecisionWithNothingToAsk(t *testing.T) {
	g := NewWithT(t)
	snap := snapshot(t, meshKey)
	plan := owner.NewPlan(owner.KDSMapping, "zone-1", snap, holding(snap, []resource.Key{meshKey}), nil)
	g.Expect(plan.Asks()).To(BeFalse())
	d := plan.Decide(nil, nil, nil)
	g.Expect(d.Err).NotTo(HaveOccurred())
	g.Expect(d.Verdicts()).To(Equal(owner.Verdicts{ref(meshKey): accepted(snap, meshKey)}))
	g.Expect(d.Shown).To(Equal(map[string][]string{"Mesh": {"default"}}))
}

package ownerpredict_test

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

const (
	accept = pluginv1.Verdict_VERDICT_ACCEPT
	wait   = pluginv1.Verdict_VERDICT_WAIT
	reject = pluginv1.Verdict_VERDICT_REJECT
)

func mesh(name string) *kdsv1.Resource { return &kdsv1.Resource{Kind: "Mesh", Name: name} }

func policy(kind, meshName, name string, owners ...*kdsv1.ResourceKey) *kdsv1.Resource {
	return &kdsv1.Resource{Kind: kind, Mesh: meshName, Name: name, Owners: owners}
}

func key(kind, meshName, name string) *kdsv1.ResourceKey {
	return &kdsv1.ResourceKey{Kind: kind, Mesh: meshName, Name: name}
}

func meshKey(name string) *kdsv1.ResourceKey { return key("Mesh", "", name) }

// verdict is a prediction without its key, which is always the candidate's.
type verdict struct {
	verdict    pluginv1.Verdict
	waitingFor *kdsv1.ResourceKey
	reason     string
}

func TestPredict(t *testing.T) {
	cases := []struct {
		name       string
		candidates []*kdsv1.Resource
		inventory  []*kdsv1.ResourceKey
		want       []verdict
	}{
		{
			name:       "mesh missing on the zone but a candidate: wait",
			candidates: []*kdsv1.Resource{mesh("default"), policy("MeshTimeout", "default", "t1")},
			want: []verdict{
				{verdict: accept},
				{wait, meshKey("default"), "waiting for Mesh default"},
			},
		},
		{
			name:       "mesh on the zone: accept",
			candidates: []*kdsv1.Resource{policy("MeshTimeout", "default", "t1")},
			inventory:  []*kdsv1.ResourceKey{meshKey("default")},
			want:       []verdict{{verdict: accept}},
		},
		{
			name:       "mesh nowhere: reject",
			candidates: []*kdsv1.Resource{policy("MeshTimeout", "default", "t1")},
			inventory:  []*kdsv1.ResourceKey{meshKey("other")},
			want: []verdict{
				{reject, nil, "owner Mesh default exists neither on the zone nor on the global"},
			},
		},
		{
			name:       "global-scoped Mesh: accept",
			candidates: []*kdsv1.Resource{mesh("default")},
			want:       []verdict{{verdict: accept}},
		},
		{
			name: "explicit owner on the zone: accept",
			candidates: []*kdsv1.Resource{
				policy("MeshHTTPRoute", "default", "r1", key("MeshService", "default", "backend")),
			},
			inventory: []*kdsv1.ResourceKey{meshKey("default"), key("MeshService", "default", "backend")},
			want:      []verdict{{verdict: accept}},
		},
		{
			name: "explicit owner among the candidates: wait",
			candidates: []*kdsv1.Resource{
				policy("MeshHTTPRoute", "default", "r1", key("MeshService", "default", "backend")),
				policy("MeshService", "default", "backend"),
			},
			inventory: []*kdsv1.ResourceKey{meshKey("default")},
			want: []verdict{
				{wait, key("MeshService", "default", "backend"), "waiting for MeshService backend in mesh default"},
				{verdict: accept},
			},
		},
		{
			name: "explicit owner nowhere: reject",
			candidates: []*kdsv1.Resource{
				policy("MeshHTTPRoute", "default", "r1", key("MeshService", "default", "backend")),
			},
			inventory: []*kdsv1.ResourceKey{meshKey("default"), key("MeshService", "other", "backend")},
			want: []verdict{
				{reject, nil, "owner MeshService backend in mesh default exists neither on the zone nor on the global"},
			},
		},
		{
			name:       "explicit owner of a global-scoped resource",
			candidates: []*kdsv1.Resource{{Kind: "Mesh", Name: "child", Owners: []*kdsv1.ResourceKey{meshKey("parent")}}, mesh("parent")},
			want: []verdict{
				{wait, meshKey("parent"), "waiting for Mesh parent"},
				{verdict: accept},
			},
		},
		{
			name: "the mesh is waited for before explicit owners",
			candidates: []*kdsv1.Resource{
				policy("MeshHTTPRoute", "default", "r1", key("MeshService", "default", "backend")),
				policy("MeshService", "default", "backend"),
				mesh("default"),
			},
			want: []verdict{
				{wait, meshKey("default"), "waiting for Mesh default"},
				{wait, meshKey("default"), "waiting for Mesh default"},
				{verdict: accept},
			},
		},
		{
			name: "explicit owners are waited for in order",
			candidates: []*kdsv1.Resource{
				policy("MeshHTTPRoute", "default", "r1", key("MeshService", "default", "a"), key("MeshService", "default", "b")),
				policy("MeshService", "default", "b"),
				policy("MeshService", "default", "a"),
			},
			inventory: []*kdsv1.ResourceKey{meshKey("default")},
			want: []verdict{
				{wait, key("MeshService", "default", "a"), "waiting for MeshService a in mesh default"},
				{verdict: accept},
				{verdict: accept},
			},
		},
		{
			name: "a missing owner rejects even when another is waited for",
			candidates: []*kdsv1.Resource{
				policy("MeshHTTPRoute", "default", "r1", key("MeshService", "default", "gone")),
				mesh("default"),
			},
			want: []verdict{
				{reject, nil, "owner MeshService gone in mesh default exists neither on the zone nor on the global"},
				{verdict: accept},
			},
		},
		{
			name: "an explicit owner that repeats the mesh",
			candidates: []*kdsv1.Resource{
				policy("MeshTimeout", "default", "t1", meshKey("default")),
			},
			inventory: []*kdsv1.ResourceKey{meshKey("default")},
			want:      []verdict{{verdict: accept}},
		},
		{
			name: "order preserved, one prediction per candidate, duplicates included",
			candidates: []*kdsv1.Resource{
				policy("MeshTimeout", "m2", "t2"),
				policy("MeshRetry", "m1", "r1"),
				mesh("m2"),
				policy("MeshTimeout", "m3", "t3"),
				policy("MeshRetry", "m1", "r1"),
			},
			inventory: []*kdsv1.ResourceKey{meshKey("m1")},
			want: []verdict{
				{wait, meshKey("m2"), "waiting for Mesh m2"},
				{verdict: accept},
				{verdict: accept},
				{reject, nil, "owner Mesh m3 exists neither on the zone nor on the global"},
				{verdict: accept},
			},
		},
		{
			name:       "a policy named like a mesh is not its mesh",
			candidates: []*kdsv1.Resource{policy("MeshTimeout", "default", "t1"), policy("MeshRetry", "x", "default")},
			inventory:  []*kdsv1.ResourceKey{key("MeshRetry", "", "default"), meshKey("x")},
			want: []verdict{
				{reject, nil, "owner Mesh default exists neither on the zone nor on the global"},
				{verdict: accept},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			resp, err := ownerpredict.New().Predict(t.Context(), &pluginv1.PredictRequest{
				Zone: "zone-1", Candidates: tc.candidates, Inventory: tc.inventory,
			})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.GetPredictions()).To(HaveLen(len(tc.want)))
			for i, p := range resp.GetPredictions() {
				c := tc.candidates[i]
				g.Expect(proto.Equal(p.GetKey(), key(c.GetKind(), c.GetMesh(), c.GetName()))).To(BeTrue(),
					"prediction %d: key %v is the candidate's", i, p.GetKey())
				g.Expect(p.GetVerdict()).To(Equal(tc.want[i].verdict), "prediction %d", i)
				g.Expect(p.GetReason()).To(Equal(tc.want[i].reason), "prediction %d", i)
				if tc.want[i].waitingFor == nil {
					g.Expect(p.GetWaitingFor()).To(BeNil(), "prediction %d", i)
				} else {
					g.Expect(proto.Equal(p.GetWaitingFor(), tc.want[i].waitingFor)).To(BeTrue(),
						"prediction %d: waiting for %v, want %v", i, p.GetWaitingFor(), tc.want[i].waitingFor)
				}
			}
		})
	}
}

func TestPredictEmpty(t *testing.T) {
	for _, req := range []*pluginv1.PredictRequest{
		nil,
		{Zone: "zone-1"},
		{Candidates: []*kdsv1.Resource{}, Inventory: []*kdsv1.ResourceKey{meshKey("default")}},
	} {
		g := NewWithT(t)
		resp, err := ownerpredict.New().Predict(t.Context(), req)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp).NotTo(BeNil())
		g.Expect(resp.GetPredictions()).To(BeEmpty())
	}
}

func TestPredictRejectsBadInput(t *testing.T) {
	cases := []struct {
		name       string
		candidates []*kdsv1.Resource
		inventory  []*kdsv1.ResourceKey
		msg        string
	}{
		{"nil candidate", []*kdsv1.Resource{mesh("m"), nil}, nil, "candidates[1]: must be set"},
		{"candidate without kind", []*kdsv1.Resource{{Name: "x"}}, nil, "candidates[0].kind: must not be empty"},
		{"candidate without name", []*kdsv1.Resource{mesh("m"), mesh("n"), {Kind: "Mesh"}}, nil, "candidates[2].name: must not be empty"},
		{"nil owner", []*kdsv1.Resource{policy("MeshTimeout", "m", "t", nil)}, nil, "candidates[0].owners[0]: must be set"},
		{"owner without kind", []*kdsv1.Resource{policy("MeshTimeout", "m", "t", meshKey("m"), key("", "m", "x"))}, nil,
			"candidates[0].owners[1].kind: must not be empty"},
		{"owner without name", []*kdsv1.Resource{policy("MeshTimeout", "m", "t", key("MeshService", "m", ""))}, nil,
			"candidates[0].owners[0].name: must not be empty"},
		{"nil inventory key", []*kdsv1.Resource{mesh("m")}, []*kdsv1.ResourceKey{meshKey("a"), nil}, "inventory[1]: must be set"},
		{"inventory key without kind", []*kdsv1.Resource{mesh("m")}, []*kdsv1.ResourceKey{key("", "", "a")}, "inventory[0].kind: must not be empty"},
		{"inventory key without name", []*kdsv1.Resource{mesh("m")}, []*kdsv1.ResourceKey{key("Mesh", "", "")}, "inventory[0].name: must not be empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			resp, err := ownerpredict.New().Predict(t.Context(), &pluginv1.PredictRequest{Candidates: tc.candidates, Inventory: tc.inventory})
			g.Expect(resp).To(BeNil())
			g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
			g.Expect(status.Convert(err).Message()).To(Equal(tc.msg))
		})
	}
}

func TestPredictCanceledContext(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := ownerpredict.New().Predict(ctx, &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{mesh("m")}})
	g.Expect(err).To(MatchError(context.Canceled))
}

func TestDescribe(t *testing.T) {
	g := NewWithT(t)
	d, err := ownerpredict.New().Describe(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.GetName()).To(Equal("owner-check"))
	g.Expect(d.GetVersion()).To(Equal(ownerpredict.Version))
	g.Expect(d.GetCapabilities()).To(Equal([]string{"mesh-owner", "explicit-owner"}))
}

// bigRequest is 10,000 candidates against a 10,000-key inventory: 100 meshes, the first 50 on
// the zone, meshes 50-74 among the candidates, 75-99 nowhere; 9,900 policies spread over them.
func bigRequest() *pluginv1.PredictRequest {
	const meshes, n = 100, 10_000
	req := &pluginv1.PredictRequest{Zone: "zone-1"}
	for m := range meshes {
		switch {
		case m < 50:
			req.Inventory = append(req.Inventory, meshKey(fmt.Sprintf("mesh-%d", m)))
		case m < 75:
			req.Candidates = append(req.Candidates, mesh(fmt.Sprintf("mesh-%d", m)))
		}
	}
	for i := len(req.Candidates); i < n; i++ {
		req.Candidates = append(req.Candidates, policy("MeshTimeout", fmt.Sprintf("mesh-%d", i%meshes), fmt.Sprintf("t-%d", i)))
	}
	for i := len(req.Inventory); i < n; i++ {
		req.Inventory = append(req.Inventory, key("MeshRetry", fmt.Sprintf("mesh-%d", i%50), fmt.Sprintf("r-%d", i)))
	}
	return req
}

func TestPredictTenThousand(t *testing.T) {
	g := NewWithT(t)
	req := bigRequest()
	g.Expect(req.GetCandidates()).To(HaveLen(10_000))
	g.Expect(req.GetInventory()).To(HaveLen(10_000))

	resp, err := ownerpredict.New().Predict(t.Context(), req)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetPredictions()).To(HaveLen(10_000))
	counts := map[pluginv1.Verdict]int{}
	for i, p := range resp.GetPredictions() {
		c := req.GetCandidates()[i]
		g.Expect(p.GetKey().GetName()).To(Equal(c.GetName()))
		counts[p.GetVerdict()]++
	}
	// Policies i = 25..9,999 sit in mesh i%100: 4,975 in meshes 0-49 (on the zone) are accepted
	// with the 25 Meshes; 2,500 in meshes 50-74 (candidates) wait; 2,500 in 75-99 are rejected.
	g.Expect(counts).To(Equal(map[pluginv1.Verdict]int{accept: 25 + 4975, wait: 2500, reject: 2500}))
}

func BenchmarkPredict10k(b *testing.B) {
	req := bigRequest()
	p := ownerpredict.New()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Predict(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

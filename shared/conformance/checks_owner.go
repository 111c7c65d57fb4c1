package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/onsi/gomega"
	"google.golang.org/protobuf/proto"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

var ownerCheckChecks = []check{
	{CheckOwnerZoneIndependent, "a plugin that declares zone_independent answers every zone alike (the host shares one answer between zones)", checkZoneIndependent, false},
	{CheckOwnerVerdictTable, "Predict follows the verdict table of docs/architecture.md (ACCEPT, WAIT for an owner, REJECT)", checkVerdictTable, false},
	{CheckOwnerBatch, fmt.Sprintf("a batch of %d candidates gets one right verdict each, in order", LargeInput), checkPredictBatch, false},
	{CheckOwnerEmptyInput, "an empty request is answered or refused with InvalidArgument, without a crash", checkPredictEmpty, false},
	{CheckOwnerBadInput, "bad input is answered or refused with InvalidArgument, without a crash", checkPredictBadInput, false},
	{CheckOwnerConcurrency, fmt.Sprintf("%d concurrent Predict calls are all answered", Concurrency), checkPredictConcurrency, false},
	{CheckOwnerLatency, fmt.Sprintf("Predict p99 latency under %s", MaxP99Latency), checkPredictLatency, false},
}

func (c *checkRun) predict(req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	return call(c, "OwnerCheck.Predict", func(ctx context.Context) (*pluginv1.PredictResponse, error) {
		return c.oc.Predict(ctx, req)
	})
}

// verdictCase is one row of the verdict table: a candidate, and what the zone should get.
type verdictCase struct {
	why        string
	candidate  *kdsv1.Resource
	verdict    pluginv1.Verdict
	waitingFor *kdsv1.ResourceKey
}

func meshKey(name string) *kdsv1.ResourceKey { return &kdsv1.ResourceKey{Kind: "Mesh", Name: name} }

// verdictTable is the verdict table of docs/architecture.md (Owner holds) as cases. The zone
// has Mesh "on-zone" and MeshRetry "parent" in it; Mesh "new" is on its way in the same batch;
// Mesh "nowhere" exists nowhere.
func verdictTable() (inventory []*kdsv1.ResourceKey, cases []verdictCase) {
	inventory = []*kdsv1.ResourceKey{meshKey("on-zone"), {Kind: "MeshRetry", Mesh: "on-zone", Name: "parent"}}
	accept, wait, reject := pluginv1.Verdict_VERDICT_ACCEPT, pluginv1.Verdict_VERDICT_WAIT, pluginv1.Verdict_VERDICT_REJECT
	cases = []verdictCase{
		{"a Mesh the zone has", &kdsv1.Resource{Kind: "Mesh", Name: "on-zone"}, accept, nil},
		{"a new Mesh (global scope, no owner)", &kdsv1.Resource{Kind: "Mesh", Name: "new"}, accept, nil},
		{"a policy whose Mesh the zone has", &kdsv1.Resource{Kind: "MeshTimeout", Mesh: "on-zone", Name: "t-on-zone"}, accept, nil},
		{"a policy whose Mesh is in the same batch", &kdsv1.Resource{Kind: "MeshTimeout", Mesh: "new", Name: "t-new"}, wait, meshKey("new")},
		{"a policy whose Mesh exists nowhere", &kdsv1.Resource{Kind: "MeshTimeout", Mesh: "nowhere", Name: "t-nowhere"}, reject, nil},
		{"an explicit owner the zone has", &kdsv1.Resource{Kind: "MeshRetry", Mesh: "on-zone", Name: "child",
			Owners: []*kdsv1.ResourceKey{{Kind: "MeshRetry", Mesh: "on-zone", Name: "parent"}}}, accept, nil},
		{"an explicit owner in the same batch", &kdsv1.Resource{Kind: "MeshHealthCheck", Mesh: "on-zone", Name: "hc",
			Owners: []*kdsv1.ResourceKey{{Kind: "MeshTimeout", Mesh: "on-zone", Name: "t-on-zone"}}},
			wait, &kdsv1.ResourceKey{Kind: "MeshTimeout", Mesh: "on-zone", Name: "t-on-zone"}},
		{"an explicit owner that exists nowhere", &kdsv1.Resource{Kind: "MeshRateLimit", Mesh: "on-zone", Name: "rl",
			Owners: []*kdsv1.ResourceKey{{Kind: "MeshTimeout", Mesh: "on-zone", Name: "ghost"}}}, reject, nil},
		{"a Mesh on its way and an owner that exists nowhere (waiting would not help)", &kdsv1.Resource{Kind: "MeshAccessLog", Mesh: "new", Name: "al",
			Owners: []*kdsv1.ResourceKey{{Kind: "MeshTimeout", Mesh: "new", Name: "ghost"}}}, reject, nil},
	}
	return inventory, cases
}

// verdictRequest is the verdict table as one Predict request, its candidates in the order of
// the cases.
func verdictRequest() (*pluginv1.PredictRequest, []verdictCase) {
	inventory, cases := verdictTable()
	req := &pluginv1.PredictRequest{Zone: "zone-1", Inventory: inventory}
	for _, tc := range cases {
		req.Candidates = append(req.Candidates, tc.candidate)
	}
	return req, cases
}

func keyString(k *kdsv1.ResourceKey) string {
	if k == nil {
		return "<none>"
	}
	if k.GetMesh() == "" {
		return k.GetKind() + " " + k.GetName()
	}
	return fmt.Sprintf("%s %s in mesh %s", k.GetKind(), k.GetName(), k.GetMesh())
}

// checkVerdicts holds predictions to the cases, in order.
func (c *checkRun) checkVerdicts(preds []*pluginv1.Prediction, cases []verdictCase) {
	c.g.Expect(preds).To(gomega.HaveLen(len(cases)), "Predict must return one prediction per candidate")
	for i, p := range preds {
		tc := cases[i]
		cand := tc.candidate
		where := fmt.Sprintf("candidate %d, %s (%s)", i, keyString(&kdsv1.ResourceKey{Kind: cand.GetKind(), Mesh: cand.GetMesh(), Name: cand.GetName()}), tc.why)
		c.g.Expect(keyString(p.GetKey())).To(gomega.Equal(keyString(&kdsv1.ResourceKey{Kind: cand.GetKind(), Mesh: cand.GetMesh(), Name: cand.GetName()})),
			"%s: the prediction's key must name its candidate (predictions are in the candidates' order)", where)
		c.g.Expect(p.GetVerdict().String()).To(gomega.Equal(tc.verdict.String()), "%s: verdict", where)
		switch tc.verdict {
		case pluginv1.Verdict_VERDICT_WAIT:
			c.g.Expect(keyString(p.GetWaitingFor())).To(gomega.Equal(keyString(tc.waitingFor)), "%s: waiting_for must name the missing owner", where)
		case pluginv1.Verdict_VERDICT_REJECT:
			c.g.Expect(p.GetReason()).NotTo(gomega.BeEmpty(), "%s: a REJECT must give a reason", where)
		}
	}
}

func checkVerdictTable(c *checkRun) {
	req, cases := verdictRequest()
	resp, err := c.predict(req)
	if err != nil {
		c.callFailed("Predict with the verdict table", err)
	}
	c.checkVerdicts(resp.GetPredictions(), cases)
	c.notef("%d cases, all right", len(cases))
}

// zoneIndependentZones are the zones the zone_independent check asks for.
var zoneIndependentZones = []string{"zone-1", "zone-2", "a-zone-with-a-long-name.example"}

func checkZoneIndependent(c *checkRun) {
	if !c.ocDesc.GetZoneIndependent() {
		c.skipf("Describe does not declare zone_independent: the host asks once per zone")
	}
	var first *pluginv1.PredictResponse
	for _, zone := range zoneIndependentZones {
		req, _ := verdictRequest()
		req.Zone = zone
		resp, err := c.predict(req)
		if err != nil {
			c.callFailed("Predict with the verdict table for zone "+zone, err)
		}
		if first == nil {
			first = resp
			continue
		}
		if !proto.Equal(first, resp) {
			c.failf("Describe declares zone_independent, but Predict answered zone %s otherwise than zone %s for the same candidates and inventory: the host would hand one zone's verdicts to another",
				zone, zoneIndependentZones[0])
		}
	}
	c.notef("the same answer for %d zones", len(zoneIndependentZones))
}

// largeBatch is LargeInput candidates over 100 meshes: 50 on the zone, 30 in the batch, 20
// nowhere. Each policy's verdict follows from its Mesh.
func largeBatch() (*pluginv1.PredictRequest, []verdictCase) {
	const meshes = 100
	req := &pluginv1.PredictRequest{Zone: "zone-1"}
	var cases []verdictCase
	add := func(tc verdictCase) {
		req.Candidates = append(req.Candidates, tc.candidate)
		cases = append(cases, tc)
	}
	name := func(m int) string { return fmt.Sprintf("mesh-%03d", m) }
	for m := range meshes {
		switch {
		case m < 50:
			req.Inventory = append(req.Inventory, meshKey(name(m)))
		case m < 80:
			add(verdictCase{"a Mesh", &kdsv1.Resource{Kind: "Mesh", Name: name(m)}, pluginv1.Verdict_VERDICT_ACCEPT, nil})
		}
	}
	for i := 0; len(req.Candidates) < LargeInput; i++ {
		m := i % meshes
		tc := verdictCase{candidate: &kdsv1.Resource{Kind: "MeshTimeout", Mesh: name(m), Name: fmt.Sprintf("timeout-%05d", i)}}
		switch {
		case m < 50:
			tc.why, tc.verdict = "its Mesh is on the zone", pluginv1.Verdict_VERDICT_ACCEPT
		case m < 80:
			tc.why, tc.verdict, tc.waitingFor = "its Mesh is in the batch", pluginv1.Verdict_VERDICT_WAIT, meshKey(name(m))
		default:
			tc.why, tc.verdict = "its Mesh exists nowhere", pluginv1.Verdict_VERDICT_REJECT
		}
		add(tc)
	}
	return req, cases
}

func checkPredictBatch(c *checkRun) {
	req, cases := largeBatch()
	start := time.Now()
	resp, err := c.predict(req)
	if err != nil {
		c.callFailed(fmt.Sprintf("Predict with %d candidates", len(cases)), err)
	}
	elapsed := time.Since(start)
	c.checkVerdicts(resp.GetPredictions(), cases)
	c.notef("%d candidates and %d inventory keys answered in %s, all right", len(req.Candidates), len(req.Inventory), round(elapsed))
	c.alive("a large batch")
}

func checkPredictEmpty(c *checkRun) {
	for _, tc := range []struct {
		name string
		req  *pluginv1.PredictRequest
	}{
		{"an empty request", &pluginv1.PredictRequest{}},
		{"no candidates and an inventory", &pluginv1.PredictRequest{Zone: "zone-1", Inventory: []*kdsv1.ResourceKey{meshKey("default")}}},
	} {
		where := "Predict with " + tc.name
		resp, err := c.predict(tc.req)
		if c.answeredOrInvalid(where, err) {
			c.g.Expect(resp.GetPredictions()).To(gomega.BeEmpty(), "%s: no candidates, no predictions", where)
		}
	}
	c.alive("empty requests")
}

func checkPredictBadInput(c *checkRun) {
	good := &kdsv1.Resource{Kind: "MeshTimeout", Mesh: "default", Name: "t"}
	for _, tc := range []struct {
		name string
		req  *pluginv1.PredictRequest
	}{
		{"a candidate without kind or name", &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{{}}}},
		{"a candidate without a name", &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{{Kind: "Mesh"}}}},
		{"an empty owner reference", &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{{Kind: "MeshTimeout", Mesh: "default", Name: "t", Owners: []*kdsv1.ResourceKey{{}}}}}},
		{"an empty inventory key", &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{proto.Clone(good).(*kdsv1.Resource)}, Inventory: []*kdsv1.ResourceKey{{}}}},
		{"a candidate owning itself", &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{{Kind: "MeshTimeout", Mesh: "default", Name: "t",
			Owners: []*kdsv1.ResourceKey{{Kind: "MeshTimeout", Mesh: "default", Name: "t"}}}}}},
	} {
		where := "Predict with " + tc.name
		resp, err := c.predict(tc.req)
		if c.answeredOrInvalid(where, err) {
			c.g.Expect(resp.GetPredictions()).To(gomega.HaveLen(len(tc.req.GetCandidates())), "%s: one prediction per candidate", where)
		}
	}
	c.alive("bad requests")
}

func checkPredictConcurrency(c *checkRun) {
	req, cases := verdictRequest()
	answers := concurrently(c, "Predict", func(int) (*pluginv1.PredictResponse, error) { return c.predict(req) })
	for _, resp := range answers {
		c.checkVerdicts(resp.GetPredictions(), cases)
	}
}

func checkPredictLatency(c *checkRun) {
	req, _ := verdictRequest()
	c.reportLatency(c.latency("Predict", func(int) error {
		_, err := c.predict(req)
		return err
	}))
}

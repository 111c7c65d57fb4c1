// Command zone-dependent is a broken OwnerCheck fixture: Describe declares zone_independent, but
// Predict answers zone-1 otherwise than any other zone (it accepts everything there and
// rejects everything elsewhere). A host that shared one answer between zones would hand a zone
// another zone's verdicts.
package main

import (
	"context"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

type zoneDependent struct{}

func (zoneDependent) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "zone-dependent", Version: "0.0.1", OwnerKinds: []string{"Mesh"}, ZoneIndependent: true}, nil
}

func (zoneDependent) Predict(_ context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	resp := &pluginv1.PredictResponse{}
	for _, c := range req.GetCandidates() {
		p := &pluginv1.Prediction{Key: &kdsv1.ResourceKey{Kind: c.GetKind(), Mesh: c.GetMesh(), Name: c.GetName()}, Verdict: pluginv1.Verdict_VERDICT_ACCEPT}
		if req.GetZone() != "zone-1" {
			p.Verdict, p.Reason = pluginv1.Verdict_VERDICT_REJECT, "not zone-1"
		}
		resp.Predictions = append(resp.Predictions, p)
	}
	return resp, nil
}

func main() { shared.ServeOwnerCheck(zoneDependent{}) }

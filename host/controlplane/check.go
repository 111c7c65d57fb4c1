package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/owner"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// ErrNotReady: the global has not read its store yet, so it cannot judge against it.
var ErrNotReady = errors.New("the global has not loaded its resources yet; try again in a moment")

// CheckRequest asks what the owner check would decide for resources on a zone.
type CheckRequest struct {
	// Zone names the zone whose inventory counts; empty means a zone that holds nothing.
	Zone      string              `json:"zone,omitempty"`
	Resources []resource.Resource `json:"resources"`
}

// CheckResult is the verdict for every resource of a CheckRequest, in order.
type CheckResult struct {
	Zone     string       `json:"zone,omitempty"`
	Items    []owner.Held `json:"items"`
	Rejected int          `json:"rejected"`
}

// Check answers a CheckRequest: the resources of the request are candidates together with
// everything the global would send the zone and the zone does not hold yet (so an owner that
// exists on the global counts), against the zone's inventory.
func (g *Global) Check(ctx context.Context, req CheckRequest) (CheckResult, error) {
	res := CheckResult{Zone: req.Zone}
	if !g.isReady() {
		return res, ErrNotReady
	}
	if len(req.Resources) == 0 {
		return res, fmt.Errorf("resources: none given")
	}
	held := map[string]map[string]string{}
	if req.Zone != "" {
		held = g.Zones.Versions(req.Zone)
	}
	var candidates []*kdsv1.Resource
	inFile := map[resource.Key]bool{}
	for i := range req.Resources {
		r := req.Resources[i]
		if err := g.cfg.Registry.Validate(&r); err != nil {
			return res, fmt.Errorf("resources[%d] (%s): %w", i, r.Key(), err)
		}
		p, err := r.ToProto()
		if err != nil {
			return res, fmt.Errorf("resources[%d]: %w", i, err)
		}
		inFile[r.Key()] = true
		candidates = append(candidates, p)
	}
	snap := g.Cache.Snapshot()
	for _, kind := range snap.Kinds() {
		for name, e := range snap.Kind(kind) {
			if _, ok := held[kind][name]; !ok && !inFile[e.Key] {
				candidates = append(candidates, e.Resource)
			}
		}
	}
	var inventory []*kdsv1.ResourceKey
	for kind, names := range held {
		for name := range names {
			k := resource.KeyFromXDSName(kind, name)
			inventory = append(inventory, &kdsv1.ResourceKey{Kind: k.Kind, Mesh: k.Mesh, Name: k.Name})
		}
	}
	timeout := g.cfg.OwnerCheckTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := g.cfg.OwnerCheck().Predict(ctx, &pluginv1.PredictRequest{Zone: req.Zone, Candidates: candidates, Inventory: inventory})
	if err != nil {
		return res, fmt.Errorf("owner check: %w", err)
	}
	for i := range req.Resources {
		p := resp.GetPredictions()[i]
		h := owner.Held{Key: req.Resources[i].Key(), Verdict: "ACCEPT", Reason: p.GetReason()}
		switch p.GetVerdict() {
		case pluginv1.Verdict_VERDICT_WAIT:
			h.Verdict = "WAIT"
			if w := p.GetWaitingFor(); w != nil {
				h.WaitingFor = resource.Key{Kind: w.GetKind(), Mesh: w.GetMesh(), Name: w.GetName()}.String()
			}
		case pluginv1.Verdict_VERDICT_REJECT:
			h.Verdict = "REJECT"
			res.Rejected++
		}
		res.Items = append(res.Items, h)
	}
	return res, nil
}

func (g *Global) serveCheck(w http.ResponseWriter, r *http.Request) {
	var req CheckRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 16<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad check request", Details: err.Error()})
		return
	}
	res, err := g.Check(r.Context(), req)
	if errors.Is(err, ErrNotReady) {
		api.WriteError(w, &api.Error{Status: http.StatusServiceUnavailable, Title: "Not ready", Details: err.Error()})
		return
	}
	if err != nil {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Cannot check", Details: err.Error()})
		return
	}
	api.WriteJSON(w, http.StatusOK, res)
}

package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// ownerMapping puts kds-host's resources on the owner check's wire as its plugins have always
// seen them: the entry's kds.v1 resource, a mesh-scoped key's mesh apart from its name.
var ownerMapping = owner.Mapping{Candidate: kds.ResourceOf, Owners: kds.OwnersOf, WireKey: kds.WireKeyOf, RefOf: kds.RefOfWireKey}

// Withheld is one resource the owner holds keep from a zone (WAIT or REJECT), or, in a
// CheckResult, any verdict: owner.Withheld in kds-host's keys, as /api/zones and /api/check
// answer it.
type Withheld struct {
	Key        resource.Key `json:"key"`
	Verdict    string       `json:"verdict"` // WAIT or REJECT (or ACCEPT, in a check)
	WaitingFor string       `json:"waitingFor,omitempty"`
	Reason     string       `json:"reason,omitempty"`
}

// withheldOf is ws in kds-host's keys; nil for none.
func withheldOf(ws []owner.Withheld) []Withheld {
	if len(ws) == 0 {
		return nil
	}
	out := make([]Withheld, len(ws))
	for i, w := range ws {
		out[i] = Withheld{Key: resource.KeyFromXDSName(w.Key.TypeURL, w.Key.Name), Verdict: w.Verdict, Reason: w.Reason}
		if w.WaitingFor != (engine.Ref{}) {
			out[i].WaitingFor = resource.KeyFromXDSName(w.WaitingFor.TypeURL, w.WaitingFor.Name).String()
		}
	}
	return out
}

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
	Zone     string     `json:"zone,omitempty"`
	Items    []Withheld `json:"items"`
	Rejected int        `json:"rejected"`
	// Warnings say what a person should know about the answer (a zone this global never saw).
	Warnings []string `json:"warnings,omitempty"`
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
	var acked map[string]map[string]string // what the zone has ACKed: kind -> xDS name -> version
	if req.Zone != "" {
		if !g.Zones.Known(req.Zone) {
			res.Warnings = append(res.Warnings, fmt.Sprintf("zone %q has not connected to this global (or left longer than --zone-grace ago): judged against a zone that holds nothing", req.Zone))
		}
		acked = g.Zones.Versions(req.Zone)
	}
	extra := make([]*kdsv1.Resource, 0, len(req.Resources))
	for i := range req.Resources {
		r := req.Resources[i]
		if err := g.cfg.Registry.Validate(&r); err != nil {
			return res, fmt.Errorf("resources[%d] (%s): %w", i, r.Key(), err)
		}
		p, err := r.ToProto()
		if err != nil {
			return res, fmt.Errorf("resources[%d]: %w", i, err)
		}
		extra = append(extra, p)
	}
	plan := owner.NewPlan(ownerMapping, req.Zone, g.Cache.Snapshot(), acked, extra)
	timeout := g.cfg.OwnerCheckTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := g.cfg.OwnerCheck().Predict(ctx, plan.Request)
	d := plan.Decide(nil, resp, err)
	if d.Err != nil {
		return res, fmt.Errorf("owner check: %w", d.Err)
	}
	res.Items = withheldOf(d.Extra)
	for _, h := range d.Extra {
		if h.Verdict == owner.Reject {
			res.Rejected++
		}
	}
	return res, nil
}

// maxCheckBytes is the largest body POST /api/check takes.
const maxCheckBytes = 16 << 20

func (g *Global) serveCheck(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCheckBytes))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		api.WriteError(w, &api.Error{Status: http.StatusRequestEntityTooLarge, Title: "Request body too large",
			Details: fmt.Sprintf("body: larger than %d bytes; check fewer resources at a time", maxCheckBytes)})
		return
	}
	if err != nil {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad check request", Details: "body: cannot be read: " + err.Error()})
		return
	}
	// The request's object and its list of resources, then each resource's own levels.
	if at, deep := api.JSONTooDeep(body, api.MaxNestingDepth+2); deep {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad check request",
			Details: fmt.Sprintf("resources: a resource nests more than %d levels of objects and lists (at byte %d of the body)", api.MaxNestingDepth, at)})
		return
	}
	var req CheckRequest
	dec := json.NewDecoder(bytes.NewReader(body))
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

package controlplane

import (
	"github.com/kds-host/kds-host/engine/retry"
)

// ZoneRetry is the retry state of a zone's stream as GET /api/zones and `kds-host inspect zones`
// show it: retry.StreamState in kds-host's words (a node is a zone, a type URL a kind), under the
// JSON keys the API has always answered.
type ZoneRetry struct {
	Stream int64  `json:"stream"`
	Zone   string `json:"zone"`
	retry.RoundState
	Failing []FailingKind `json:"failing,omitempty"`
}

// FailingKind is one kind of a zone's stream with names the zone refused and has not accepted
// since.
type FailingKind struct {
	Kind   string       `json:"kind"`
	Parked []ParkedName `json:"parked,omitempty"`
	retry.Failures
	// Held is Parked under its old JSON name, for the clients that read "held".
	//
	// Deprecated: use Parked (JSON "parked"); "held" is emitted for one more release only.
	Held []ParkedName `json:"held,omitempty"`
}

// ParkedName is a rejected name the retry policy parks: not resent until its content changes.
type ParkedName struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// zoneRetryOf is rs as a zone's retry state; nil for nil.
func zoneRetryOf(rs *retry.StreamState) *ZoneRetry {
	if rs == nil {
		return nil
	}
	zr := &ZoneRetry{Stream: rs.Stream, Zone: rs.Node, RoundState: rs.RoundState}
	for _, ts := range rs.Failing {
		fk := FailingKind{Kind: ts.TypeURL, Failures: ts.Failures}
		for _, p := range ts.Parked {
			fk.Parked = append(fk.Parked, ParkedName{Kind: p.TypeURL, Name: p.Name, Reason: p.Reason})
		}
		fk.Held = fk.Parked // deprecated JSON "held", kept one release
		zr.Failing = append(zr.Failing, fk)
	}
	return zr
}

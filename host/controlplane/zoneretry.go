package controlplane

import (
	"time"

	"github.com/kds-host/kds-host/engine/retry"
)

// ZoneRetry is the retry state of a zone's stream as GET /api/zones and `kds-host inspect zones`
// show it: retry.StreamState in kds-host's words (a node is a zone, a type URL a kind), under the
// JSON keys the API has always answered.
type ZoneRetry struct {
	Stream    int64      `json:"stream"`
	Zone      string     `json:"zone"`
	Round     uint32     `json:"round"`
	LastDelay string     `json:"lastDelay,omitempty"`
	NextRetry *time.Time `json:"nextRetry,omitempty"`
	GivenUp   string     `json:"givenUp,omitempty"`
	// Reason is the reason the policy gave for the decision in force (the armed round or the
	// give-up); a decision of the built-in fallback says so, and why.
	Reason  string        `json:"reason,omitempty"`
	Failing []FailingKind `json:"failing,omitempty"`
}

// FailingKind is one kind of a zone's stream with names the zone refused and has not accepted
// since.
type FailingKind struct {
	Kind      string       `json:"kind"`
	Rejected  []string     `json:"rejected"`
	Parked    []ParkedName `json:"parked,omitempty"`
	NACKs     uint32       `json:"nacks"`
	FirstNACK time.Time    `json:"firstNack"`
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
	zr := &ZoneRetry{Stream: rs.Stream, Zone: rs.Node, Round: rs.Round, LastDelay: rs.LastDelay,
		NextRetry: rs.NextRetry, GivenUp: rs.GivenUp, Reason: rs.Reason}
	for _, ts := range rs.Failing {
		fk := FailingKind{Kind: ts.TypeURL, Rejected: ts.Rejected, NACKs: ts.NACKs, FirstNACK: ts.FirstNACK}
		for _, p := range ts.Parked {
			fk.Parked = append(fk.Parked, ParkedName{Kind: p.TypeURL, Name: p.Name, Reason: p.Reason})
		}
		fk.Held = fk.Parked // deprecated JSON "held", kept one release
		zr.Failing = append(zr.Failing, fk)
	}
	return zr
}

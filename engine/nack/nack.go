// Package nack reads what an xDS client refused from its NACK: the one reading of a NACK, for
// the engine and the guard alike. A NACK says what it refused in one of three ways, read in this
// order:
//
//  1. the structured rejection list (kds-host's kds.v1.RejectionList) in error_detail.details,
//     with a name, a reason and a cause per refused resource;
//  2. the message, where the client names what it refused: grpc-go quotes each name
//     (`resource "NAME": ...`), Envoy ends each with a colon (`... cluster(s) NAME: ...`);
//  3. neither: every resource the response brought new (a version the client did not hold),
//     else every resource it carried but those it carried again (Carried.Again).
package nack

import (
	"slices"
	"strings"
	"unicode/utf8"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/engine/event"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// Carried is one resource the refused response carried.
type Carried struct {
	Name, Version string
	// New: the client did not hold this version before the response.
	New bool
	// Again: a SotW full state carried it again, as the client held it (or had refused it) when
	// the response was made, not as something the response brings: refused only when the NACK
	// names it.
	Again bool
}

// Read is what a NACK refused of the resources its response carried, each name once, in the
// order they were carried, and the message kept, at most maxText bytes (each reason at most a
// quarter of it). A refusal read from the message, or the whole response, gets the cause plain:
// the structured detail is the only way a client says why.
func Read(detail *rpcstatus.Status, carried []Carried, maxText int, plain event.Cause) (rejected []event.Rejection, message string) {
	msg := detail.GetMessage()
	if len(msg) > maxRead {
		msg = msg[:maxRead] // read bounded, whatever the client sends
	}
	message = Truncate(msg, maxText)
	byName := make(map[string]int, len(carried))
	for i, c := range carried {
		byName[c.Name] = i
	}
	if list := RejectionListOf(detail); list != nil {
		seen := map[string]bool{}
		for _, r := range list.GetRejections() {
			i, sent := byName[r.GetName()]
			if !sent || seen[r.GetName()] {
				continue // not in the response it answers, or named twice: once is enough
			}
			seen[r.GetName()] = true
			rj := event.Rejection{Name: r.GetName(), Version: carried[i].Version, Reason: Truncate(r.GetReason(), maxText/4), Cause: causeOf(r.GetCause())}
			if mo := r.GetMissingOwner(); mo != nil {
				rj.MissingOwner = ownerKey(mo.GetKind(), mo.GetMesh(), mo.GetName())
				if rj.Cause == event.CauseUnspecified {
					rj.Cause = event.CauseMissingOwner // a client that names the owner but predates causes
				}
			}
			rejected = append(rejected, rj)
		}
		slices.SortFunc(rejected, func(a, b event.Rejection) int { return byName[a.Name] - byName[b.Name] })
		return rejected, message
	}
	refuse := func(c Carried, reason string) {
		rejected = append(rejected, event.Rejection{Name: c.Name, Version: c.Version, Reason: reason, Cause: plain})
	}
	named := namedIn(msg)
	for _, c := range carried {
		if c.Name != "" && named[c.Name] {
			refuse(c, Truncate(reasonFor(msg, c.Name), min(maxReason, maxText/4)))
		}
	}
	if len(rejected) > 0 {
		return rejected, message
	}
	reason := Truncate(msg, min(maxReason, maxText/4))
	for _, c := range carried {
		if c.New && !c.Again {
			refuse(c, reason)
		}
	}
	if len(rejected) == 0 {
		for _, c := range carried {
			if !c.Again {
				refuse(c, reason)
			}
		}
	}
	return rejected, message
}

const (
	// maxRead bounds the part of a message read for the names it gives.
	maxRead = 64 << 10
	// maxReason bounds the reason kept for one refused resource read from the message.
	maxReason = 512
)

// namedIn is what msg names: every quoted string, and every word (between spaces, commas,
// parentheses or line ends) that a colon ends, without that colon. It reads msg once, whatever
// the number of names.
func namedIn(msg string) map[string]bool {
	named := map[string]bool{}
	for rest := msg; ; {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i+1:], '"')
		if j < 0 {
			break
		}
		named[rest[i+1:i+1+j]] = true
		rest = rest[i+1+j+1:]
	}
	for _, w := range strings.FieldsFunc(msg, func(r rune) bool { return strings.ContainsRune(" ,(\n", r) }) {
		if name, ok := strings.CutSuffix(w, ":"); ok && name != "" {
			named[name] = true
		}
	}
	return named
}

// reasonFor is what msg says of name: grpc-go's text for that resource, else the whole message.
func reasonFor(msg, name string) string {
	if i := strings.Index(msg, `resource "`+name+`": `); i >= 0 {
		r := msg[i+len(`resource "`+name+`": `):]
		if j := strings.Index(r, ";\n"); j >= 0 {
			r = r[:j]
		}
		return r
	}
	return msg
}

// causeOf reads a wire cause; an unknown value counts as unspecified.
func causeOf(c kdsv1.Cause) event.Cause {
	switch c {
	case kdsv1.Cause_CAUSE_TRANSIENT:
		return event.CauseTransient
	case kdsv1.Cause_CAUSE_MISSING_OWNER:
		return event.CauseMissingOwner
	case kdsv1.Cause_CAUSE_INVALID:
		return event.CauseInvalid
	}
	return event.CauseUnspecified
}

// Truncate cuts s to at most n bytes, on a rune boundary, and says so.
func Truncate(s string, n int) string {
	if len(s) <= n || n <= 0 {
		return s
	}
	const more = "... (truncated)"
	cut := max(0, n-len(more))
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}

// RejectionListOf finds the structured rejection list in a NACK's error_detail, or returns nil.
func RejectionListOf(detail *rpcstatus.Status) *kdsv1.RejectionList {
	for _, d := range detail.GetDetails() {
		list := &kdsv1.RejectionList{}
		if d.MessageIs(list) && d.UnmarshalTo(list) == nil {
			return list
		}
	}
	return nil
}

// Detail builds the error_detail of a NACK that carries a structured rejection list: a message
// a person reads, and the list the server acts on.
func Detail(list *kdsv1.RejectionList, message string) (*rpcstatus.Status, error) {
	a, err := anypb.New(list)
	if err != nil {
		return nil, err
	}
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: message, Details: []*anypb.Any{a}}, nil
}

// ownerKey names a missing owner as KIND/NAME, or KIND/MESH/NAME in a mesh (kds-host's keys).
func ownerKey(kind, mesh, name string) string {
	if mesh == "" {
		return kind + "/" + name
	}
	return kind + "/" + mesh + "/" + name
}

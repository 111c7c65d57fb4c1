// Package event names what happens on an xDS client's stream (opened, sent, ACKed, NACKed,
// closed) for the parts of a control plane that react to it, without the xDS stack.
package event

import "time"

import "iter"

// Cause is why a client refused a resource, as its structured rejection list says it (the Cause
// enum without its CAUSE_ prefix); empty when the client did not say.
type Cause string

// The causes a client gives.
const (
	// CauseUnspecified: the client did not say (a plain xDS client such as Envoy, or one that
	// predates causes).
	CauseUnspecified Cause = ""
	// CauseTransient: the client cannot take it now (admission not ready, a timeout).
	CauseTransient Cause = "TRANSIENT"
	// CauseMissingOwner: the client lacks the resource it refers to (Rejection.MissingOwner).
	CauseMissingOwner Cause = "MISSING_OWNER"
	// CauseInvalid: the content itself is refused; the same content again cannot help.
	CauseInvalid Cause = "INVALID"
)

// Rejection is one resource a client refused in a NACK.
type Rejection struct {
	Name string `json:"name"`
	// Version is the version the client refused.
	Version string `json:"version,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Cause   Cause  `json:"cause,omitempty"`
	// MissingOwner is the resource the client lacks, with CauseMissingOwner, as TYPE/NAME (see
	// OwnerName); kds-host's zones name it by kind and xDS name (Mesh/default).
	MissingOwner string `json:"missingOwner,omitempty"`
}

// OwnerName is how Rejection.MissingOwner names the resource name of type typeURL.
func OwnerName(typeURL, name string) string { return typeURL + "/" + name }

// ReRequest is a client asking again, over its stream, for names it refused once their cause
// cleared (it subscribes to them again). Answered tells whether the server resends them now;
// false: the stream's rate limit refused it.
type ReRequest struct {
	StreamID int64
	Node     string
	TypeURL  string
	Names    []string
	Answered bool
}

// NACK is a client's refusal of (part of) one response.
type NACK struct {
	StreamID int64
	Node     string
	TypeURL  string
	// Rejected are the refused resources; without a structured rejection list from the client,
	// every resource of the response counts as refused.
	Rejected []Rejection
	// Accepted maps the names of the response the client did store to their versions.
	Accepted map[string]string
	Detail   string
}

// ACK is a client's acceptance of one response: it stored Versions (by name) and removed Removed.
// Initial marks what a client reported holding when it subscribed (initial_resource_versions).
// Versions and Removed are the response's own: observers read them during the call only, and
// never change them.
type ACK struct {
	StreamID int64
	Node     string
	TypeURL  string
	Versions Versions
	Removed  []string
	Initial  bool
	Sent     time.Time // when the answered response was handed to the stream (zero when Initial)
}

// Sent is one response that went out: resources (versions by name) and removals of one type.
type Sent struct {
	StreamID int64
	Node     string
	TypeURL  string
	Versions Versions
	Removed  []string
}

// Versions is what one response carried, name -> version, as a read-only view of the response
// itself: no map is made per response for the observers. The zero value is empty.
type Versions struct {
	n    int
	src  VersionSource // when set, each and get are not
	each func(yield func(name, version string) bool)
	get  func(name string) (string, bool)
}

// A VersionSource is a response's pairs read in place, for VersionsFrom: a pointer to what the
// sender keeps of the response, so that a view costs no allocation on every send and answer.
type VersionSource interface {
	EachVersion(yield func(name, version string) bool)
	Version(name string) (string, bool)
}

// VersionsFrom is a view of the n pairs of src.
func VersionsFrom(n int, src VersionSource) Versions { return Versions{n: n, src: src} }

// VersionsOf is a view of m.
func VersionsOf(m map[string]string) Versions {
	return Versions{
		n: len(m),
		each: func(yield func(string, string) bool) {
			for k, v := range m {
				if !yield(k, v) {
					return
				}
			}
		},
		get: func(name string) (string, bool) { v, ok := m[name]; return v, ok },
	}
}

// VersionsFunc is a view of n pairs that each yields and get finds.
func VersionsFunc(n int, each func(yield func(name, version string) bool), get func(name string) (string, bool)) Versions {
	return Versions{n: n, each: each, get: get}
}

// Len is how many names the response carried.
func (v Versions) Len() int { return v.n }

// Copy is v's pairs in a map of their own, for an observer that reads them after its call
// returns (the view reads the response in place, and the sender may reuse what it read).
func (v Versions) Copy() Versions {
	m := make(map[string]string, v.n)
	for name, version := range v.All() {
		m[name] = version
	}
	return VersionsOf(m)
}

// All yields every name and its version.
func (v Versions) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		switch {
		case v.src != nil:
			v.src.EachVersion(yield)
		case v.each != nil:
			v.each(yield)
		}
	}
}

// Get is the version of name, if the response carried it.
func (v Versions) Get(name string) (string, bool) {
	switch {
	case v.src != nil:
		return v.src.Version(name)
	case v.get != nil:
		return v.get(name)
	}
	return "", false
}

// Observer is told what happens on client streams; a nil func is not told. The funcs run on the
// stream's goroutines, one call at a time per stream, inside the xDS callbacks (the engine's own
// stream loop tells of a request on the goroutine that read it, of a response on the one that
// sends it): they must record and return, never block.
type Observer struct {
	StreamOpened func(streamID int64, node string)
	Sent         func(Sent)
	ACK          func(ACK)
	NACK         func(NACK)
	ReRequest    func(ReRequest)
	StreamClosed func(streamID int64, node string)
	// Refused: a stream was refused (no or a bad token, a node id the token does not allow, a
	// limit), or closed because a newer stream of its node replaced it.
	Refused func(Refusal)
}

// Refusal is a stream the server refused or closed. Reason is a short word for metrics
// (unauthenticated, permission_denied, limit, invalid, replaced); Detail says what a person needs.
type Refusal struct {
	Reason string
	Node   string // when known
	Detail string
}

// Observers tells each of its observers, in order.
type Observers []Observer

// StreamOpened tells every observer that a node's stream opened.
func (os Observers) StreamOpened(id int64, node string) {
	for _, o := range os {
		if o.StreamOpened != nil {
			o.StreamOpened(id, node)
		}
	}
}

// Sent tells every observer that a response went out.
func (os Observers) Sent(s Sent) {
	for _, o := range os {
		if o.Sent != nil {
			o.Sent(s)
		}
	}
}

// ACK tells every observer of an ACK.
func (os Observers) ACK(a ACK) {
	for _, o := range os {
		if o.ACK != nil {
			o.ACK(a)
		}
	}
}

// NACK tells every observer of a NACK.
func (os Observers) NACK(n NACK) {
	for _, o := range os {
		if o.NACK != nil {
			o.NACK(n)
		}
	}
}

// ReRequest tells every observer of a client's re-request.
func (os Observers) ReRequest(r ReRequest) {
	for _, o := range os {
		if o.ReRequest != nil {
			o.ReRequest(r)
		}
	}
}

// Refused tells every observer of a refused or replaced stream.
func (os Observers) Refused(r Refusal) {
	for _, o := range os {
		if o.Refused != nil {
			o.Refused(r)
		}
	}
}

// StreamClosed tells every observer that a node's stream closed.
func (os Observers) StreamClosed(id int64, node string) {
	for _, o := range os {
		if o.StreamClosed != nil {
			o.StreamClosed(id, node)
		}
	}
}

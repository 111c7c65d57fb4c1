// Package event names what happens on a zone's KDS stream (opened, sent, ACKed, NACKed, closed)
// for the parts of the global that react to it, without the xDS stack.
package event

// Rejection is one resource a zone refused in a NACK.
type Rejection struct {
	Name string `json:"name"`
	// Version is the version the zone refused.
	Version      string `json:"version,omitempty"`
	Reason       string `json:"reason,omitempty"`
	MissingOwner string `json:"missingOwner,omitempty"`
}

// NACK is a zone's refusal of (part of) one response.
type NACK struct {
	StreamID int64
	Zone     string
	Kind     string
	// Rejected are the refused resources; without a structured rejection list from the zone,
	// every resource of the response counts as refused.
	Rejected []Rejection
	// Accepted maps the names of the response the zone did store to their versions.
	Accepted map[string]string
	Detail   string
}

// ACK is a zone's acceptance of one response: it stored Versions (by name) and removed Removed.
// Initial marks what a zone reported holding when it subscribed (initial_resource_versions).
type ACK struct {
	StreamID int64
	Zone     string
	Kind     string
	Versions map[string]string
	Removed  []string
	Initial  bool
}

// Sent is one response that went out: resources (versions by name) and removals of one kind.
type Sent struct {
	StreamID int64
	Zone     string
	Kind     string
	Versions map[string]string
	Removed  []string
}

// Observer is told what happens on zone streams; a nil func is not told. The funcs run on the
// stream's goroutine, inside the xDS callbacks: they must record and return, never block.
type Observer struct {
	StreamOpened func(streamID int64, zone string)
	Sent         func(Sent)
	ACK          func(ACK)
	NACK         func(NACK)
	StreamClosed func(streamID int64, zone string)
}

// Observers tells each of its observers, in order.
type Observers []Observer

// StreamOpened tells every observer that a zone's stream opened.
func (os Observers) StreamOpened(id int64, zone string) {
	for _, o := range os {
		if o.StreamOpened != nil {
			o.StreamOpened(id, zone)
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

// StreamClosed tells every observer that a zone's stream closed.
func (os Observers) StreamClosed(id int64, zone string) {
	for _, o := range os {
		if o.StreamClosed != nil {
			o.StreamClosed(id, zone)
		}
	}
}

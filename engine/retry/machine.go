// Package retry sends again, on a backoff schedule, what xDS clients rejected: stream-level rounds
// decided by a RetryForcer policy off the stream's goroutine, applied by one timer per stream.
//
// Machine is the decision, per stream, as plain state transitions: events go in with the time
// they happen, actions come out; it holds no goroutine, lock, timer or clock. Scheduler is the
// driver that owns those: it feeds the xDS events to each stream's Machine and carries out what
// the Machine asks (call the policy, arm the timer, resend names). The xDS callbacks only
// record; nothing here ever blocks a stream.
package retry

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kds-host/kds-host/engine/event"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// failedDecisionDelay is the round's delay when no policy, not even the fallback, answered:
// retry in a second rather than never.
const failedDecisionDelay = time.Second

// Machine is one client stream's retry state. The zero value is not ready: use NewMachine.
//
// A failing type is due (NACKed, waiting for a round) or resent (sent again by a round, waiting
// for the client's answer). While some type is due and no decision or timer is outstanding and
// the policy has not given up, the Machine asks for a decision: that one rule is what keeps
// every failing type covered, whatever order the events come in.
type Machine struct {
	stream int64
	node   string

	failing map[string]*failingType
	round   uint32
	last    time.Duration // delay of the previous round
	givenUp string        // the policy's reason, while it has given up
	reason  string        // the reason of the decision in force (armed round or give-up)

	// token names the outstanding decision or timer; an answer with another token is stale.
	token   uint64
	asking  bool      // a decision is outstanding
	armed   bool      // the timer is armed
	nextAt  time.Time // when the armed timer fires
	delay   time.Duration
	planned []string // type URLs the armed round resends; none: every failing type
}

// failingType is one type URL with names the client refused and has not accepted since.
type failingType struct {
	rejected  map[string]*rejectedName // what a round resends
	parked    map[string]parkedName    // what the policy parks until its content changes
	detail    string
	nacks     uint32
	firstNACK time.Time
	due       bool // NACKed since its last resend
}

// rejectedName is one refused name: the version refused, why, and how often.
type rejectedName struct {
	version       string
	cause         event.Cause
	owner         string // event.Rejection.MissingOwner
	attempts      uint32 // NACKs of this version, whatever their cause
	causeAttempts uint32 // NACKs of this version in a row with this cause
}

// parkedName is a refused name the policy parks: not resent until its content changes, or, for a
// name that missed its owner, until the client ACKs that owner.
type parkedName struct {
	rejectedName
	reason string
}

// active reports whether the type has names a round would resend.
func (ft *failingType) active() bool { return len(ft.rejected) > 0 }

// NewMachine returns the retry state of a stream that has just opened.
func NewMachine(stream int64, node string) *Machine {
	return &Machine{stream: stream, node: node, failing: map[string]*failingType{}}
}

// Ready is what a Machine asks of its driver after an event. Any field may be empty.
type Ready struct {
	// Ask: ask the policy for a schedule with this request, and hand the answer to Decided
	// with Token.
	Ask *pluginv1.ScheduleRequest
	// Arm: arm the stream's timer for this long, and call Fired with Token when it fires.
	Arm time.Duration
	// Disarm: stop the stream's timer. Answers already on their way will be stale.
	Disarm bool
	// Token identifies the decision or the timer asked for.
	Token uint64
	// Resend: send these names of each type URL again (a round fired).
	Resend map[string][]string
	// Round reports a round that fired: its delay and the names resent per type URL.
	Round *Round
	// GaveUp reports the policy's give-up, with its reason.
	GaveUp string
	// Parked reports the names the policy just parked, with their reasons.
	Parked []ParkedName
	// Released counts, by type URL, the names resent at once because the owner they missed was
	// ACKed (they are in Resend too).
	Released map[string]int
	// Decision reports the policy's answer that Decided took, for the log.
	Decision *Decision
}

// Decision is one answer of the policy that a stream acted on.
type Decision struct {
	// Round is the round the decision is for (0: the first since the failing set was empty).
	Round uint32
	// Delay is how long the round waits; zero with GiveUp.
	Delay time.Duration
	// TypeURLs are the types the round resends; none: every failing type.
	TypeURLs []string
	GiveUp   bool
	// Parked counts the names the decision parks until their content changes.
	Parked int
	// Reason is the policy's reason, or why no policy answered.
	Reason string
	// Err is set when no policy answered (the round then waits failedDecisionDelay).
	Err error
}

// ParkedName is a rejected name the policy parks: not resent until its content changes (the
// policy's answer named it in ScheduleResponse.hold).
type ParkedName struct {
	TypeURL string `json:"typeUrl"`
	Name    string `json:"name"`
	Reason  string `json:"reason"`
}

// Round is a retry round that fired.
type Round struct {
	Delay  time.Duration
	Resent map[string]int
}

// NACK records a rejection; the rejected names become due for a round.
func (m *Machine) NACK(n event.NACK, now time.Time) Ready {
	ft := m.failing[n.TypeURL]
	if ft == nil {
		ft = &failingType{rejected: map[string]*rejectedName{}, parked: map[string]parkedName{}, firstNACK: now}
		m.failing[n.TypeURL] = ft
	}
	for name := range n.Accepted {
		delete(ft.rejected, name)
		delete(ft.parked, name)
	}
	for _, rj := range n.Rejected {
		if h, ok := ft.parked[rj.Name]; ok && h.version == rj.Version {
			continue // parked: the client refused it once more, and it stays parked
		}
		delete(ft.parked, rj.Name)
		rn := ft.rejected[rj.Name]
		if rn == nil || rn.version != rj.Version {
			rn = &rejectedName{version: rj.Version}
			ft.rejected[rj.Name] = rn
		}
		if rn.attempts == 0 || rn.cause != rj.Cause {
			rn.causeAttempts = 0
		}
		rn.cause, rn.owner = rj.Cause, rj.MissingOwner
		rn.attempts++
		rn.causeAttempts++
	}
	ft.nacks++
	ft.detail = n.Detail
	ft.due = true
	var r Ready
	m.settle(&r)
	m.next(&r)
	return r
}

// ACK records that the client stored the names of a response. What a client reports holding when
// it subscribes (an initial ACK) says nothing about what it refused on this stream.
func (m *Machine) ACK(a event.ACK, _ time.Time) Ready {
	var r Ready
	if a.Initial {
		return r
	}
	if ft := m.failing[a.TypeURL]; ft != nil {
		for name := range a.Versions.All() {
			delete(ft.rejected, name)
			delete(ft.parked, name)
		}
	}
	m.release(a, &r)
	m.settle(&r)
	m.next(&r)
	return r
}

// release resends at once the names that missed an owner the ACK brought, parked ones
// included: a parked name that missed its owner is rejected again (due for rounds) once resent.
func (m *Machine) release(a event.ACK, r *Ready) {
	if a.Versions.Len() == 0 {
		return
	}
	brought := func(rn rejectedName) bool {
		if rn.cause != event.CauseMissingOwner || rn.owner == "" {
			return false
		}
		ownerType, ownerName, _ := strings.Cut(rn.owner, "/")
		_, ok := a.Versions.Get(ownerName)
		return ok && ownerType == a.TypeURL
	}
	for _, typeURL := range sortedTypes(m.failing) {
		ft := m.failing[typeURL]
		wasActive := ft.active()
		var names []string
		for name, rn := range ft.rejected {
			if brought(*rn) {
				names = append(names, name)
			}
		}
		for name, p := range ft.parked {
			if brought(p.rejectedName) {
				rn := p.rejectedName
				ft.rejected[name] = &rn
				delete(ft.parked, name)
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			continue
		}
		if !wasActive {
			ft.due = false // only released names: they wait for the client's answer, as after a round
		}
		slices.Sort(names)
		if r.Resend == nil {
			r.Resend, r.Released = map[string][]string{}, map[string]int{}
		}
		r.Resend[typeURL] = names
		r.Released[typeURL] = len(names)
	}
}

// Sent records a response that went out. A rejected name sent with another version has new
// content: it is no longer the refused version, and a give-up no longer holds. A removed name is
// nothing to resend any more.
func (m *Machine) Sent(s event.Sent, _ time.Time) Ready {
	var r Ready
	ft := m.failing[s.TypeURL]
	if ft == nil {
		return r
	}
	for name, v := range s.Versions.All() {
		if h, ok := ft.parked[name]; ok && h.version != v {
			delete(ft.parked, name)
		}
		if rn, ok := ft.rejected[name]; ok && rn.version != v {
			delete(ft.rejected, name)
			if m.givenUp != "" {
				m.givenUp = ""
				m.round, m.last = 0, 0
			}
		}
	}
	for _, name := range s.Removed {
		delete(ft.rejected, name)
		delete(ft.parked, name)
	}
	m.settle(&r)
	m.next(&r)
	return r
}

// Decided takes the policy's answer to the Ask with token; err means no policy answered.
func (m *Machine) Decided(token uint64, resp *pluginv1.ScheduleResponse, err error, now time.Time) Ready {
	var r Ready
	if token != m.token || !m.asking {
		return r // the stream moved on since it asked
	}
	m.asking = false
	d := &Decision{Round: m.round, Reason: resp.GetReason(), Err: err}
	r.Decision = d
	if err == nil {
		m.park(resp.GetHold(), &r)
		d.Parked = len(r.Parked)
		if !m.anyActive() {
			m.settle(&r) // the policy parked everything there was to resend
			return r
		}
		if !resp.GetGiveUp() && resp.GetDelay().AsDuration() <= 0 && len(r.Parked) > 0 {
			// The answer parked every name it was asked about, so it needs no delay, and names
			// rejected since are left: ask about those at once. (Each such answer parks a name,
			// so this ends.)
			m.reason = d.Reason
			m.next(&r)
			return r
		}
	}
	switch {
	case err != nil, !resp.GetGiveUp() && resp.GetDelay().AsDuration() <= 0:
		d.Delay = failedDecisionDelay
		d.Reason = "no policy answered; retrying in " + failedDecisionDelay.String()
		if err != nil {
			d.Reason = "no policy answered (" + err.Error() + "); retrying in " + failedDecisionDelay.String()
		}
		m.arm(failedDecisionDelay, nil, now, &r)
	case resp.GetGiveUp():
		m.givenUp = resp.GetReason()
		if m.givenUp == "" {
			m.givenUp = "the policy gave up"
		}
		d.GiveUp, d.Reason = true, m.givenUp
		r.GaveUp = m.givenUp
	default:
		d.Delay, d.TypeURLs = resp.GetDelay().AsDuration(), resp.GetKinds()
		m.arm(d.Delay, d.TypeURLs, now, &r)
	}
	m.reason = d.Reason
	return r
}

// park moves the names the policy parks (its answer's hold) out of what rounds resend.
func (m *Machine) park(names []*pluginv1.HeldName, r *Ready) {
	for _, h := range names {
		ft := m.failing[h.GetKind()]
		if ft == nil {
			continue
		}
		rn, ok := ft.rejected[h.GetName()]
		if !ok {
			continue
		}
		reason := h.GetReason()
		if reason == "" {
			reason = "the policy parks it until its content changes"
		}
		delete(ft.rejected, h.GetName())
		ft.parked[h.GetName()] = parkedName{rejectedName: *rn, reason: reason}
		r.Parked = append(r.Parked, ParkedName{TypeURL: h.GetKind(), Name: h.GetName(), Reason: reason})
	}
}

func (m *Machine) anyActive() bool {
	for _, ft := range m.failing {
		if ft.active() {
			return true
		}
	}
	return false
}

func (m *Machine) arm(d time.Duration, typeURLs []string, now time.Time, r *Ready) {
	m.armed, m.nextAt, m.delay, m.planned = true, now.Add(d), d, typeURLs
	r.Arm, r.Token = d, m.token
}

// Fired runs the round of the timer with token: the rejected names of the planned types (every
// failing type when the plan names none) are sent again, all at once.
func (m *Machine) Fired(token uint64, _ time.Time) Ready {
	var r Ready
	if token != m.token || !m.armed {
		return r
	}
	m.armed, m.nextAt = false, time.Time{}
	m.round++
	m.last = m.delay
	typeURLs := m.planned
	if len(typeURLs) == 0 {
		typeURLs = sortedTypes(m.failing)
	}
	r.Resend = map[string][]string{}
	r.Round = &Round{Delay: m.delay, Resent: map[string]int{}}
	for _, typeURL := range typeURLs {
		ft := m.failing[typeURL]
		if ft == nil || !ft.active() {
			continue
		}
		names := ft.names()
		r.Resend[typeURL] = names
		r.Round.Resent[typeURL] = len(names)
		ft.due = false
	}
	// A type that failed after the plan was made, and was left out of it, gets its own round.
	m.next(&r)
	return r
}

// settle drops the types with no rejected or parked name left; with nothing left to resend, the
// stream starts over: no round is outstanding and the next NACK starts from round 0.
func (m *Machine) settle(r *Ready) {
	for typeURL, ft := range m.failing {
		if !ft.active() && len(ft.parked) == 0 {
			delete(m.failing, typeURL)
		}
	}
	if m.anyActive() {
		return
	}
	if m.asking || m.armed {
		r.Disarm = true
	}
	m.token++
	m.asking, m.armed, m.nextAt, m.planned = false, false, time.Time{}, nil
	m.round, m.last, m.givenUp, m.reason = 0, 0, "", ""
}

// quiet reports whether the Machine is at rest: nothing failing, nothing outstanding, nothing
// to reset. A Sent or an ACK then changes nothing but the token, which names nothing
// outstanding (Scheduler.skips relies on it).
func (m *Machine) quiet() bool {
	return len(m.failing) == 0 && !m.asking && !m.armed && m.givenUp == "" && m.reason == "" && m.round == 0 && m.last == 0 && m.planned == nil
}

// next asks for a decision when a type is due and nothing is outstanding.
func (m *Machine) next(r *Ready) {
	if m.asking || m.armed || m.givenUp != "" {
		return
	}
	due := false
	for _, ft := range m.failing {
		due = due || ft.due && ft.active()
	}
	if !due {
		return
	}
	m.token++
	m.asking = true
	r.Ask, r.Token = m.request(), m.token
}

// request is what the policy is asked: every failing type of the stream.
func (m *Machine) request() *pluginv1.ScheduleRequest {
	req := &pluginv1.ScheduleRequest{
		StreamId: strconv.FormatInt(m.stream, 10), Zone: m.node,
		Round: m.round, LastDelay: durationpb.New(m.last),
	}
	for _, typeURL := range sortedTypes(m.failing) {
		ft := m.failing[typeURL]
		if !ft.active() {
			continue
		}
		names := ft.names()
		f := &pluginv1.FailingKind{
			Kind: typeURL, RejectedNames: names, ErrorDetail: ft.detail,
			NackCount: ft.nacks, FirstNack: timestamppb.New(ft.firstNACK),
		}
		for _, n := range names {
			rn := ft.rejected[n]
			f.Rejected = append(f.Rejected, &pluginv1.RejectedName{Name: n, Cause: wireCause(rn.cause), MissingOwner: ownerKey(rn.owner), Attempts: rn.attempts, CauseAttempts: rn.causeAttempts})
		}
		req.Failing = append(req.Failing, f)
	}
	return req
}

// wireCause is a cause as plugin.v1 carries it.
func wireCause(c event.Cause) kdsv1.Cause {
	switch c {
	case event.CauseTransient:
		return kdsv1.Cause_CAUSE_TRANSIENT
	case event.CauseMissingOwner:
		return kdsv1.Cause_CAUSE_MISSING_OWNER
	case event.CauseInvalid:
		return kdsv1.Cause_CAUSE_INVALID
	}
	return kdsv1.Cause_CAUSE_UNSPECIFIED
}

// ownerKey reads event.Rejection.MissingOwner as the plugin wire's resource key (a NAME of
// MESH/LOCAL is a mesh-scoped key of kds-host's).
func ownerKey(owner string) *kdsv1.ResourceKey {
	typeURL, name, ok := strings.Cut(owner, "/")
	if !ok {
		return nil
	}
	mesh, local, scoped := strings.Cut(name, "/")
	if !scoped {
		return &kdsv1.ResourceKey{Kind: typeURL, Name: name}
	}
	return &kdsv1.ResourceKey{Kind: typeURL, Mesh: mesh, Name: local}
}

func (ft *failingType) names() []string {
	names := make([]string, 0, len(ft.rejected))
	for n := range ft.rejected {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func sortedTypes(m map[string]*failingType) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TypeState is the retry state of one failing type of a stream.
type TypeState struct {
	TypeURL string       `json:"typeUrl"`
	Parked  []ParkedName `json:"parked,omitempty"`
	Failures
}

// Failures are the names of a type a stream's client refused and has not accepted since, and
// its NACKs since the first.
type Failures struct {
	Rejected  []string  `json:"rejected"`
	NACKs     uint32    `json:"nacks"`
	FirstNACK time.Time `json:"firstNack"`
}

// StreamState is the retry state of one stream, for insights.
type StreamState struct {
	Stream int64  `json:"stream"`
	Node   string `json:"node"`
	RoundState
	Failing []TypeState `json:"failing,omitempty"`
}

// RoundState is the retry decision in force on a stream: the round armed, or the give-up.
type RoundState struct {
	Round     uint32     `json:"round"`
	LastDelay string     `json:"lastDelay,omitempty"`
	NextRetry *time.Time `json:"nextRetry,omitempty"`
	GivenUp   string     `json:"givenUp,omitempty"`
	// Reason is the reason the policy gave for the decision in force (the armed round or the
	// give-up); a decision of the built-in fallback says so, and why.
	Reason string `json:"reason,omitempty"`
}

// State is the stream's retry state as insights show it.
func (m *Machine) State() StreamState {
	ss := StreamState{Stream: m.stream, Node: m.node, RoundState: RoundState{Round: m.round, GivenUp: m.givenUp, Reason: m.reason}}
	if m.last > 0 {
		ss.LastDelay = m.last.String()
	}
	if m.armed {
		t := m.nextAt
		ss.NextRetry = &t
	}
	for _, typeURL := range sortedTypes(m.failing) {
		ft := m.failing[typeURL]
		ts := TypeState{TypeURL: typeURL, Failures: Failures{Rejected: ft.names(), NACKs: ft.nacks, FirstNACK: ft.firstNACK}}
		for _, n := range slices.Sorted(maps.Keys(ft.parked)) {
			ts.Parked = append(ts.Parked, ParkedName{TypeURL: typeURL, Name: n, Reason: ft.parked[n].reason})
		}
		ss.Failing = append(ss.Failing, ts)
	}
	return ss
}

// Package retry sends again, on a backoff schedule, what zones rejected: stream-level rounds
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

// Machine is one zone stream's retry state. The zero value is not ready: use NewMachine.
//
// A failing kind is due (NACKed, waiting for a round) or resent (sent again by a round, waiting
// for the zone's answer). While some kind is due and no decision or timer is outstanding and the
// policy has not given up, the Machine asks for a decision: that one rule is what keeps every
// failing kind covered, whatever order the events come in.
type Machine struct {
	stream int64
	zone   string

	failing map[string]*failingKind
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
	planned []string // kinds the armed round resends; none: every failing kind
}

// failingKind is one kind with names the zone refused and has not accepted since.
type failingKind struct {
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
// name that missed its owner, until the zone ACKs that owner.
type parkedName struct {
	rejectedName
	reason string
}

// active reports whether the kind has names a round would resend.
func (fk *failingKind) active() bool { return len(fk.rejected) > 0 }

// NewMachine returns the retry state of a stream that has just opened.
func NewMachine(stream int64, zone string) *Machine {
	return &Machine{stream: stream, zone: zone, failing: map[string]*failingKind{}}
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
	// Resend: send these names of each kind again (a round fired).
	Resend map[string][]string
	// Round reports a round that fired: its delay and the names resent per kind.
	Round *Round
	// GaveUp reports the policy's give-up, with its reason.
	GaveUp string
	// Parked reports the names the policy just parked, with their reasons.
	Parked []ParkedName
	// Released counts, by kind, the names resent at once because the owner they missed was
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
	// Kinds are the kinds the round resends; none: every failing kind.
	Kinds  []string
	GiveUp bool
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
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Round is a retry round that fired.
type Round struct {
	Delay  time.Duration
	Resent map[string]int
}

// NACK records a rejection; the rejected names become due for a round.
func (m *Machine) NACK(n event.NACK, now time.Time) Ready {
	fk := m.failing[n.TypeURL]
	if fk == nil {
		fk = &failingKind{rejected: map[string]*rejectedName{}, parked: map[string]parkedName{}, firstNACK: now}
		m.failing[n.TypeURL] = fk
	}
	for name := range n.Accepted {
		delete(fk.rejected, name)
		delete(fk.parked, name)
	}
	for _, rj := range n.Rejected {
		if h, ok := fk.parked[rj.Name]; ok && h.version == rj.Version {
			continue // parked: the zone refused it once more, and it stays parked
		}
		delete(fk.parked, rj.Name)
		rn := fk.rejected[rj.Name]
		if rn == nil || rn.version != rj.Version {
			rn = &rejectedName{version: rj.Version}
			fk.rejected[rj.Name] = rn
		}
		if rn.attempts == 0 || rn.cause != rj.Cause {
			rn.causeAttempts = 0
		}
		rn.cause, rn.owner = rj.Cause, rj.MissingOwner
		rn.attempts++
		rn.causeAttempts++
	}
	fk.nacks++
	fk.detail = n.Detail
	fk.due = true
	var r Ready
	m.settle(&r)
	m.next(&r)
	return r
}

// ACK records that the zone stored the names of a response. What a zone reports holding when
// it subscribes (an initial ACK) says nothing about what it refused on this stream.
func (m *Machine) ACK(a event.ACK, _ time.Time) Ready {
	var r Ready
	if a.Initial {
		return r
	}
	if fk := m.failing[a.TypeURL]; fk != nil {
		for name := range a.Versions.All() {
			delete(fk.rejected, name)
			delete(fk.parked, name)
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
		ownerKind, ownerName, _ := strings.Cut(rn.owner, "/")
		_, ok := a.Versions.Get(ownerName)
		return ok && ownerKind == a.TypeURL
	}
	for _, kind := range sortedKinds(m.failing) {
		fk := m.failing[kind]
		wasActive := fk.active()
		var names []string
		for name, rn := range fk.rejected {
			if brought(*rn) {
				names = append(names, name)
			}
		}
		for name, p := range fk.parked {
			if brought(p.rejectedName) {
				rn := p.rejectedName
				fk.rejected[name] = &rn
				delete(fk.parked, name)
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			continue
		}
		if !wasActive {
			fk.due = false // only released names: they wait for the zone's answer, as after a round
		}
		slices.Sort(names)
		if r.Resend == nil {
			r.Resend, r.Released = map[string][]string{}, map[string]int{}
		}
		r.Resend[kind] = names
		r.Released[kind] = len(names)
	}
}

// Sent records a response that went out. A rejected name sent with another version has new
// content: it is no longer the refused version, and a give-up no longer holds. A removed name is
// nothing to resend any more.
func (m *Machine) Sent(s event.Sent, _ time.Time) Ready {
	var r Ready
	fk := m.failing[s.TypeURL]
	if fk == nil {
		return r
	}
	for name, v := range s.Versions.All() {
		if h, ok := fk.parked[name]; ok && h.version != v {
			delete(fk.parked, name)
		}
		if rn, ok := fk.rejected[name]; ok && rn.version != v {
			delete(fk.rejected, name)
			if m.givenUp != "" {
				m.givenUp = ""
				m.round, m.last = 0, 0
			}
		}
	}
	for _, name := range s.Removed {
		delete(fk.rejected, name)
		delete(fk.parked, name)
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
		d.Delay, d.Kinds = resp.GetDelay().AsDuration(), resp.GetKinds()
		m.arm(d.Delay, d.Kinds, now, &r)
	}
	m.reason = d.Reason
	return r
}

// park moves the names the policy parks (its answer's hold) out of what rounds resend.
func (m *Machine) park(names []*pluginv1.HeldName, r *Ready) {
	for _, h := range names {
		fk := m.failing[h.GetKind()]
		if fk == nil {
			continue
		}
		rn, ok := fk.rejected[h.GetName()]
		if !ok {
			continue
		}
		reason := h.GetReason()
		if reason == "" {
			reason = "the policy parks it until its content changes"
		}
		delete(fk.rejected, h.GetName())
		fk.parked[h.GetName()] = parkedName{rejectedName: *rn, reason: reason}
		r.Parked = append(r.Parked, ParkedName{Kind: h.GetKind(), Name: h.GetName(), Reason: reason})
	}
}

func (m *Machine) anyActive() bool {
	for _, fk := range m.failing {
		if fk.active() {
			return true
		}
	}
	return false
}

func (m *Machine) arm(d time.Duration, kinds []string, now time.Time, r *Ready) {
	m.armed, m.nextAt, m.delay, m.planned = true, now.Add(d), d, kinds
	r.Arm, r.Token = d, m.token
}

// Fired runs the round of the timer with token: the rejected names of the planned kinds (every
// failing kind when the plan names none) are sent again, all at once.
func (m *Machine) Fired(token uint64, _ time.Time) Ready {
	var r Ready
	if token != m.token || !m.armed {
		return r
	}
	m.armed, m.nextAt = false, time.Time{}
	m.round++
	m.last = m.delay
	kinds := m.planned
	if len(kinds) == 0 {
		kinds = sortedKinds(m.failing)
	}
	r.Resend = map[string][]string{}
	r.Round = &Round{Delay: m.delay, Resent: map[string]int{}}
	for _, kind := range kinds {
		fk := m.failing[kind]
		if fk == nil || !fk.active() {
			continue
		}
		names := fk.names()
		r.Resend[kind] = names
		r.Round.Resent[kind] = len(names)
		fk.due = false
	}
	// A kind that failed after the plan was made, and was left out of it, gets its own round.
	m.next(&r)
	return r
}

// settle drops the kinds with no rejected or parked name left; with nothing left to resend, the
// stream starts over: no round is outstanding and the next NACK starts from round 0.
func (m *Machine) settle(r *Ready) {
	for kind, fk := range m.failing {
		if !fk.active() && len(fk.parked) == 0 {
			delete(m.failing, kind)
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

// next asks for a decision when a kind is due and nothing is outstanding.
func (m *Machine) next(r *Ready) {
	if m.asking || m.armed || m.givenUp != "" {
		return
	}
	due := false
	for _, fk := range m.failing {
		due = due || fk.due && fk.active()
	}
	if !due {
		return
	}
	m.token++
	m.asking = true
	r.Ask, r.Token = m.request(), m.token
}

// request is what the policy is asked: every failing kind of the stream.
func (m *Machine) request() *pluginv1.ScheduleRequest {
	req := &pluginv1.ScheduleRequest{
		StreamId: strconv.FormatInt(m.stream, 10), Zone: m.zone,
		Round: m.round, LastDelay: durationpb.New(m.last),
	}
	for _, kind := range sortedKinds(m.failing) {
		fk := m.failing[kind]
		if !fk.active() {
			continue
		}
		names := fk.names()
		f := &pluginv1.FailingKind{
			Kind: kind, RejectedNames: names, ErrorDetail: fk.detail,
			NackCount: fk.nacks, FirstNack: timestamppb.New(fk.firstNACK),
		}
		for _, n := range names {
			rn := fk.rejected[n]
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

// ownerKey reads KIND/XDS-NAME (event.Rejection.MissingOwner) as a resource key.
func ownerKey(owner string) *kdsv1.ResourceKey {
	kind, name, ok := strings.Cut(owner, "/")
	if !ok {
		return nil
	}
	mesh, local, scoped := strings.Cut(name, "/")
	if !scoped {
		return &kdsv1.ResourceKey{Kind: kind, Name: name}
	}
	return &kdsv1.ResourceKey{Kind: kind, Mesh: mesh, Name: local}
}

func (fk *failingKind) names() []string {
	names := make([]string, 0, len(fk.rejected))
	for n := range fk.rejected {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func sortedKinds(m map[string]*failingKind) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// KindState is the retry state of one failing kind of a stream.
type KindState struct {
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

// StreamState is the retry state of one stream, for insights.
type StreamState struct {
	Stream    int64      `json:"stream"`
	Zone      string     `json:"zone"`
	Round     uint32     `json:"round"`
	LastDelay string     `json:"lastDelay,omitempty"`
	NextRetry *time.Time `json:"nextRetry,omitempty"`
	GivenUp   string     `json:"givenUp,omitempty"`
	// Reason is the reason the policy gave for the decision in force (the armed round or the
	// give-up); a decision of the built-in fallback says so, and why.
	Reason  string      `json:"reason,omitempty"`
	Failing []KindState `json:"failing,omitempty"`
}

// State is the stream's retry state as insights show it.
func (m *Machine) State() StreamState {
	ss := StreamState{Stream: m.stream, Zone: m.zone, Round: m.round, GivenUp: m.givenUp, Reason: m.reason}
	if m.last > 0 {
		ss.LastDelay = m.last.String()
	}
	if m.armed {
		t := m.nextAt
		ss.NextRetry = &t
	}
	for _, kind := range sortedKinds(m.failing) {
		fk := m.failing[kind]
		ks := KindState{Kind: kind, Rejected: fk.names(), NACKs: fk.nacks, FirstNACK: fk.firstNACK}
		for _, n := range slices.Sorted(maps.Keys(fk.parked)) {
			ks.Parked = append(ks.Parked, ParkedName{Kind: kind, Name: n, Reason: fk.parked[n].reason})
		}
		ks.Held = ks.Parked // deprecated JSON "held", kept one release
		ss.Failing = append(ss.Failing, ks)
	}
	return ss
}

package engine

import (
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/internal/serial"
)

// Session is what the server knows of one client stream, behind one lock: what the node holds
// of each type, the responses in flight, the watches and the sender that answers them, and the
// insight counters. What the node ACKed is what it was delivered, under two layers: each
// response in flight's priors, and refused names.
//
// Invariants (under mu):
//   - acked(type URL, name) is the priors of the oldest response in flight carrying the name;
//     else refused; else delivered.
//   - digest and each type's acked count are those of acked (setView, account).
//   - inflight holds at most MaxInFlight responses, oldest first; one forgotten folds into
//     refused, so acked does not change.
type Session struct {
	cache *Cache
	id    int64
	info  *streamInfo // the node its credentials prove, and how to close it
	sotw  bool        // a SotW stream (sotw.go)

	serial.Queue // the retry scheduler steps retry through it, one event at a time
	retry        retry.Stream

	mu         sync.Mutex // guards the fields below, the types' states and the watches; never held across a send or an observer
	node       string     // the node id; "" until the first request names it
	kinds      kindStates
	queue      []*watch                       // answered watches waiting for the sender, in order
	inflight   []*inflight                    // responses handed to the server and not answered yet, oldest first
	reRequests *tokenBucket                   // the node's (Cache.admit): its re-request budget
	digest     Digest                         // of what the node ACKed
	unknown    map[string]map[string]struct{} // by type URL: names subscribed or reported held that the snapshot did not hold then (admitNames)
	forgot     bool                           // a response in flight was forgotten (MaxInFlight): unanswered holds no longer counts all
	stall      stallTimer                     // closes the stream when a response stays unanswered too long

	acct budgetAccount // the stream's room in the budget (guarded by the budget's lock)

	// Set by the engine's own stream loop (stream.go): sendNow sends the queued responses on the
	// caller's goroutine when it can without waiting, and reports whether it sent them all; kick
	// has them sent, without waiting or locking. A write's fan-out defers the wake-up (deferWake).
	sendNow   func() bool
	deferWake bool
	kick      func()

	view atomic.Pointer[viewBox]  // what the node may see, as last published (Cache.Publish)
	own  atomic.Pointer[Snapshot] // the node's own snapshot (Cache.SetNodeSnapshot); written under mu

	senderRuns bool           // a sender runs (under mu; go-control-plane's server's sessions)
	closing    bool           // the stream is closing: no sender starts (under mu)
	senders    sync.WaitGroup // the sender, while it runs
	stop       chan struct{}  // closed when the stream closes
}

// MaxInFlight bounds the unanswered responses of one stream that the server remembers: beyond
// it the oldest is forgotten (an answer to it is ignored; the client keeps what it had).
const MaxInFlight = 64

// kindState is what a session knows of one type.
type kindState struct {
	name      string                  // the type URL
	requested bool                    // the node asked for the type on this stream
	watch     *watch                  // the open watch, if any
	started   bool                    // delivered was seeded from the node's initial versions
	delivered delivered               // name -> what the node was sent or reported holding (its Version)
	edits     uint64                  // changes of delivered so far: a response in flight knows whether any came after it
	refused   map[string]ackedVersion // names whose delivered version the node refused: what it holds instead
	acked     int                     // names the node has ACKed
	dirty     map[string]bool         // names that may differ from the snapshot (markDirty; nil until the first)
	full      bool                    // every name may differ: look at them all
	forced    map[string]bool         // names to send although the node was sent their version (markForced; nil until the first)
	sotwSeq   uint64                  // SotW: responses made of the type (its versions' suffix)
	sub       cache.Subscription      // what the client asks for, as of its last request of the type
	// With a Withholder (withhold.go): the names held back, the names kept although no longer
	// served, each with why, and what the versions the client accepted reference.
	holds        map[string]Hold
	kept         map[string]string
	acceptedRefs map[string][]Ref // of accepted versions that reference something
	sotwSub      subKey           // SotW: what the client asked for when answered last (subscriptionKey)
	sotwWhole    bool             // SotW: the next watch is answered with the client's whole state of the type

	// What happened to the type on this stream, for the insight.
	sent, responses, acks, nacks, resent int64
	lastError                            string
	rejected                             []event.Rejection
}

// markDirty makes name dirty.
func (ks *kindState) markDirty(name string) {
	if ks.dirty == nil {
		ks.dirty = map[string]bool{}
	}
	ks.dirty[name] = true
}

// markForced makes name forced (and not dirty: callers mark that).
func (ks *kindState) markForced(name string) {
	if ks.forced == nil {
		ks.forced = map[string]bool{}
	}
	ks.forced[name] = true
}

// ackedVersion is the version of a name the node has ACKed (ok false: none).
type ackedVersion struct {
	version string
	ok      bool
}

// inflight is one response handed to the delta server and not answered yet.
type inflight struct {
	kind     string
	ks       *kindState // the session's state of kind
	resp     *discovery.DeltaDiscoveryResponse
	nonce    string                       // set when the server sends it
	priors   priorSet                     // what the node had ACKed of its names before, for those it had ACKed
	all      bool                         // it carries exactly a snapshot's entries of its type, to a node that had none
	allSum   uint64                       // with all: their kindOrder.acked
	edits    uint64                       // the type's delivered edits once this response was counted in it
	cost     int64                        // the room it holds in the cache's budget, until it leaves inflight
	sotw     *discovery.DiscoveryResponse // the SotW response sent, of which resp is the delta; nil for delta
	again    []namedVersion               // SotW: what sotw carries beyond resp, by name (holdsAfter)
	againAll map[string]*Entry            // SotW, instead of again: sotw is these entries (those not in resp: again)
	since    time.Time                    // when it got its room, to be sent (the response timeout runs from here)
}

// covers reports whether the response carries name, and if so what the node had ACKed before.
func (r *inflight) covers(name string) (ackedVersion, bool) {
	if h := r.prior(name); h.ok {
		return h, true
	}
	if _, ok := r.Version(name); ok {
		return ackedVersion{}, true
	}
	_, ok := slices.BinarySearch(r.resp.RemovedResources, name)
	return ackedVersion{}, ok
}

// Version is the version of name the response carries, if it does (its resources are sorted).
func (r *inflight) Version(name string) (string, bool) {
	i, ok := slices.BinarySearchFunc(r.resp.Resources, name, func(res *discovery.Resource, n string) int { return strings.Compare(res.Name, n) })
	if !ok {
		return "", false
	}
	return r.resp.Resources[i].Version, true
}

// view is the response's resources as the stream events show them, read in place.
func (r *inflight) view() event.Versions { return event.VersionsFrom(len(r.resp.Resources), r) }

// EachVersion yields the name and version of every resource the response carries (view).
func (r *inflight) EachVersion(yield func(name, version string) bool) {
	for _, res := range r.resp.Resources {
		if !yield(res.Name, res.Version) {
			return
		}
	}
}

func byName(a, b *discovery.Resource) int { return strings.Compare(a.Name, b.Name) }

// signal has the queue sent: it kicks the stream loop, or starts the sender of a stream of
// go-control-plane's server unless it runs. Call with s.mu.
func (s *Session) signal() {
	switch {
	case s.kick != nil:
		s.kick()
	case !s.senderRuns && !s.closing && !s.info.loop:
		s.senderRuns = true
		s.senders.Go(s.send)
	}
}

func newSession(c *Cache, id int64, info *streamInfo, sotw bool) *Session {
	return &Session{
		cache: c, id: id, info: info, sotw: sotw, kinds: kindStates{known: make([]*kindState, len(c.kinds))},
		stop: make(chan struct{}),
	}
}

// snapshot is what the session serves: its node's snapshot, else the cache's (or nil).
func (s *Session) snapshot() *Snapshot {
	if own := s.own.Load(); own != nil {
		return own
	}
	if s.cache.nodeSnaps.Load() {
		return nil
	}
	return s.cache.snap.Load()
}

// kind is the session's state of type k (a type URL), made on first use.
func (s *Session) kind(k string) *kindState {
	if ks := s.kinds.get(s.cache, k); ks != nil {
		return ks
	}
	ks := &kindState{name: k}
	if i, ok := s.cache.kindAt[k]; ok {
		s.kinds.known[i] = ks
	} else {
		if s.kinds.other == nil {
			s.kinds.other = map[string]*kindState{}
		}
		s.kinds.other[k] = ks
	}
	return ks
}

// kindStates is a session's state of each type it was asked for: the cache's types by their
// place in Cache.kinds, any other by its type URL.
type kindStates struct {
	known []*kindState // by the type's place in Cache.kinds; nil: not asked for
	other map[string]*kindState
}

// get is the state of a type, nil if the session has none.
func (k *kindStates) get(c *Cache, kind string) *kindState {
	if i, ok := c.kindAt[kind]; ok {
		return k.known[i]
	}
	return k.other[kind]
}

// each calls f with every type's state, the cache's types first, in their order.
func (k *kindStates) each(f func(*kindState)) {
	for _, ks := range k.known {
		if ks != nil {
			f(ks)
		}
	}
	for _, ks := range k.other {
		f(ks)
	}
}

// ackedLocked is the version of kind/name (type URL, xDS name) the node has ACKed. Call with s.mu.
func (s *Session) ackedLocked(kind, name string) ackedVersion { return s.ackedExcept(kind, name, nil) }

// ackedExcept is ackedLocked as if the response in flight except were not. Call with s.mu.
func (s *Session) ackedExcept(kind, name string, except *inflight) ackedVersion {
	if o := s.carrier(kind, name, except); o != nil {
		h, _ := o.covers(name)
		return h
	}
	if ks := s.kinds.get(s.cache, kind); ks != nil {
		if h, ok := ks.refused[name]; ok {
			return h
		}
		if r, ok := ks.delivered.get(name); ok {
			return ackedVersion{r.Version, true}
		}
	}
	return ackedVersion{}
}

// layered reports whether a refused name or a response in flight but except is over delivered.
func (s *Session) layered(ks *kindState, kind string, except *inflight) bool {
	return len(ks.refused) > 0 || slices.ContainsFunc(s.inflight, func(o *inflight) bool { return o != except && o.kind == kind })
}

// setDelivered and dropDelivered change delivered, and count the change (edits).
func (ks *kindState) setDelivered(name string, r *discovery.Resource) {
	ks.delivered.set(name, r)
	ks.edits++
}

func (ks *kindState) dropDelivered(name string) {
	ks.delivered.drop(name)
	ks.edits++
}

// eachAckedLocked calls f with every name of the type the node has ACKed. Call with s.mu.
func (s *Session) eachAckedLocked(kind string, f func(name, version string)) {
	ks := s.kinds.get(s.cache, kind)
	if ks == nil {
		return
	}
	if !s.layered(ks, kind, nil) {
		ks.delivered.each(func(n string, r *discovery.Resource) { f(n, r.Version) })
		return
	}
	seen := map[string]bool{}
	look := func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		if h := s.ackedLocked(kind, n); h.ok {
			f(n, h.version)
		}
	}
	ks.delivered.each(func(n string, _ *discovery.Resource) { look(n) })
	for n := range ks.refused {
		look(n)
	}
	for _, r := range s.inflight {
		if r.kind == kind {
			r.priors.each(look)
		}
	}
}

// setView runs change, which may change what the node ACKed of kind/name, and accounts it.
func (s *Session) setView(kind, name string, change func()) {
	before := s.ackedLocked(kind, name)
	change()
	s.account(s.kind(kind), kind, name, before, s.ackedLocked(kind, name))
}

// account moves the digest and the type's count (in ks, the type's state) from before to after.
func (s *Session) account(ks *kindState, kind, name string, before, after ackedVersion) {
	if before == after {
		return
	}
	if before.ok {
		s.digest.Sum ^= ackedHash(kind, name, before.version)
		s.digest.N--
		ks.acked--
	}
	if after.ok {
		s.digest.Sum ^= ackedHash(kind, name, after.version)
		s.digest.N++
		ks.acked++
	}
}

// forgetLocked drops the oldest in-flight response, as if the node had refused it. Call with s.mu.
func (s *Session) forgetLocked(r *inflight) {
	s.dropLocked(r)
	s.forgot = true
	eachName(r.resp, func(name string) {
		h, _ := r.covers(name)
		s.layLocked(r.ks, r.kind, name, h, nil)
	})
}

// layLocked records that the node holds h of kind/name now. Call with s.mu.
func (s *Session) layLocked(ks *kindState, kind, name string, h ackedVersion, except *inflight) {
	if o := s.carrier(kind, name, except); o != nil {
		o.setPrior(name, h)
	} else {
		ks.setRefused(name, h)
	}
}

// unanswered is the room the responses in flight hold, or no bound once one was forgotten.
func (s *Session) unanswered() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forgot {
		return math.MaxInt64
	}
	var n int64
	for _, r := range s.inflight {
		n += r.cost
	}
	return n
}

// dropLocked takes r out of the responses in flight.
func (s *Session) dropLocked(r *inflight) {
	if i := slices.Index(s.inflight, r); i >= 0 {
		s.inflight = slices.Delete(s.inflight, i, i+1)
	}
	s.cache.budget.release(&s.acct, r.cost)
	r.cost = 0
}

// carrier is the oldest response in flight (but except) that carries name of the type, or nil.
func (s *Session) carrier(kind, name string, except *inflight) *inflight {
	for _, o := range s.inflight {
		if o.kind == kind && o != except {
			if _, ok := o.covers(name); ok {
				return o
			}
		}
	}
	return nil
}

// setPrior records that the node holds h of name before r arrives.
func (r *inflight) setPrior(name string, h ackedVersion) {
	if !h.ok {
		r.priors.del(name)
		return
	}
	r.priors.set(name, h.version)
}

// setRefused records that the node holds h of name, where delivered may say otherwise.
func (ks *kindState) setRefused(name string, h ackedVersion) {
	if d, ok := ks.delivered.get(name); ok == h.ok && (!ok || d.Version == h.version) {
		delete(ks.refused, name) // delivered says h
		return
	}
	if ks.refused == nil {
		ks.refused = map[string]ackedVersion{}
	}
	ks.refused[name] = h
}

// answerLocked applies the node's answer to r, the oldest response in flight of its type, an
// ACK (nack nil) or a NACK: the node now holds what r carried but the rejected names, of which it
// keeps what it had. Call with s.mu.
func (s *Session) answerLocked(r *inflight, nack *event.NACK) {
	ks := r.ks
	var rejected map[string]bool
	if nack == nil {
		ks.acks++
		if len(ks.rejected) > 0 { // an ACK of what it refused clears it; a response without it does not
			ks.rejected = slices.DeleteFunc(slices.Clone(ks.rejected), func(rj event.Rejection) bool { _, ok := r.covers(rj.Name); return ok })
			if len(ks.rejected) == 0 {
				ks.rejected, ks.lastError = nil, ""
			}
		}
	} else {
		ks.nacks++
		ks.rejected, ks.lastError = nack.Rejected, nack.Detail
		rejected = make(map[string]bool, len(nack.Rejected))
		for _, rj := range nack.Rejected {
			rejected[rj.Name] = true
		}
	}
	// In step (delivered unchanged since r, no layers), the node holds what r carried.
	inStep := r.edits == ks.edits && !s.layered(ks, r.kind, r)
	if nack == nil && inStep && r.all && r.priors.empty() {
		s.digest.Sum ^= r.allSum
		s.digest.N += len(r.resp.Resources)
		ks.acked += len(r.resp.Resources)
		s.dropLocked(r)
		return
	}
	apply := func(name string, now ackedVersion) {
		had := r.prior(name)
		if rejected[name] {
			now = had
		} else if inStep {
			s.account(ks, r.kind, name, had, now)
			return
		}
		before := s.ackedLocked(r.kind, name)
		s.layLocked(ks, r.kind, name, now, r)
		s.account(ks, r.kind, name, before, s.ackedExcept(r.kind, name, r))
	}
	for _, res := range r.resp.Resources {
		apply(res.Name, ackedVersion{res.Version, true})
	}
	for _, n := range r.resp.RemovedResources {
		apply(n, ackedVersion{})
	}
	s.dropLocked(r)
}

// prior is what the node had ACKed, before r, of a name r carries.
func (r *inflight) prior(name string) ackedVersion {
	if v, ok := r.priors.get(name); ok {
		return ackedVersion{v, true}
	}
	return ackedVersion{}
}

// sentLocked records that the server sends resp, with its nonce, and counts it. resp is the
// response handed over as flight (nil: found by resp), or one the cache did not make (a test),
// counted as handed over now. Call with s.mu.
func (s *Session) sentLocked(resp *discovery.DeltaDiscoveryResponse, flight *inflight) *inflight {
	r := flight
	if flight == nil || flight.resp != resp || !slices.Contains(s.inflight, flight) {
		r = nil
		if i := slices.IndexFunc(s.inflight, func(f *inflight) bool { return f.resp == resp && f.nonce == "" }); i >= 0 {
			r = s.inflight[i]
		}
	}
	switch {
	case r != nil:
	case flight != nil:
		r = &inflight{kind: resp.GetTypeUrl(), ks: s.kind(resp.GetTypeUrl()), resp: resp}
	default:
		r, _ = s.handOverLocked(s.kind(resp.GetTypeUrl()), resp.GetTypeUrl(), resp, nil, nil)
	}
	r.countSent(resp.GetNonce())
	return r
}

// countSent records that the server sends r with nonce, and counts it. Call with s.mu.
func (r *inflight) countSent(nonce string) {
	r.nonce = nonce
	r.ks.responses++
	r.ks.sent += int64(len(r.resp.GetResources()) + len(r.resp.GetRemovedResources()))
}

// carries reports whether resp is in flight on the stream. Call with s.mu.
func (s *Session) carries(resp *discovery.DeltaDiscoveryResponse) bool {
	return slices.ContainsFunc(s.inflight, func(r *inflight) bool { return r.resp == resp })
}

// byNonce finds the response in flight a request answers.
func (s *Session) byNonce(nonce string) *inflight {
	if i := slices.IndexFunc(s.inflight, func(r *inflight) bool { return r.nonce == nonce }); i >= 0 {
		return s.inflight[i]
	}
	return nil
}

// viewBox holds a View for an atomic pointer.
type viewBox struct{ View }

// publish installs v unless the session has a later view of its node already.
func (s *Session) publish(v View) {
	for cur := s.view.Load(); cur == nil || cur.View.Seq() < v.Seq(); cur = s.view.Load() {
		if s.view.CompareAndSwap(cur, &viewBox{v}) {
			return
		}
	}
}

// Retry is the stream's retry state (retry.Scheduler steps it through Do).
func (s *Session) Retry() *retry.Stream { return &s.retry }

// Resend is Cache.Resend of this stream.
func (s *Session) Resend(names map[string][]string) { s.mark(names, true) }

// Node is the node id of the client the session serves ("" before its first request).
func (s *Session) Node() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node
}

// AckedVersion is the version of a resource (type URL, xDS name) the node has ACKed.
func (s *Session) AckedVersion(typeURL, name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.ackedLocked(typeURL, name)
	return h.version, h.ok
}

// Acked calls f with every type URL, xDS name and version the node has ACKed of typeURLs (nil:
// of every type), holding the session's lock: f must not block.
func (s *Session) Acked(typeURLs []string, f func(typeURL, name, version string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if typeURLs == nil {
		s.kinds.each(func(ks *kindState) { typeURLs = append(typeURLs, ks.name) })
	}
	for _, typeURL := range typeURLs {
		s.eachAckedLocked(typeURL, func(n, v string) { f(typeURL, n, v) })
	}
}

// Digest identifies what the node has ACKed now.
func (s *Session) Digest() Digest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.digest
}

// Insight is what happened to each type on the stream that something was sent, answered or
// reported held of, and how much of it the node has ACKed. The caller owns the copies.
func (s *Session) Insight() []*TypeInsight {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*TypeInsight
	s.kinds.each(func(ks *kindState) {
		if ks.responses == 0 && ks.acks == 0 && ks.nacks == 0 && ks.acked == 0 && len(ks.holds) == 0 {
			return
		}
		out = append(out, &TypeInsight{TypeURL: ks.name, Sent: ks.sent, Responses: ks.responses, ACKs: ks.acks, NACKs: ks.nacks, Resent: ks.resent,
			LastError: ks.lastError, Rejected: slices.Clone(ks.rejected), Known: ks.acked,
			Holds: slices.SortedFunc(maps.Values(ks.holds), func(a, b Hold) int { return strings.Compare(a.Name, b.Name) })})
	})
	return out
}

// InFlight is how many of the session's responses are not answered yet.
func (s *Session) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight)
}

// unknownVersion stands, in delivered, for a name whose version the node must be told again.
var unknownVersion = &discovery.Resource{}

// versionOnly stands, in delivered, for a version the node reported that is not served.
func versionOnly(name, version string) *discovery.Resource {
	return &discovery.Resource{Name: name, Version: version}
}

// Digest identifies what a node has ACKed (every type URL, name and version): two nodes with
// equal digests hold the same, but for a 2^-64 chance. It is the XOR of one hash a resource.
type Digest struct {
	Sum uint64
	N   int // resources ACKed
}

// digestSeed is this process's: digests compare within one process only.
var digestSeed = maphash.MakeSeed()

func ackedHash(kind, name, version string) uint64 {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	h.WriteString(kind)
	h.WriteByte(0)
	h.WriteString(name)
	h.WriteByte(0)
	h.WriteString(version)
	return h.Sum64()
}

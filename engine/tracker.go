package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/nack"
)

// Tracker is the delta (and SotW) server's Callbacks: it opens and closes each stream's Session,
// admits its node, pairs ACKs and NACKs with the responses they answer, and tells its observers.
type Tracker struct {
	cache     *Cache
	observers event.Observers
	limits    Limits
	plain     event.Cause                              // of a refusal read from a NACK without a structured list
	stalls    bool                                     // SetCallbacksStallStreams
	nodeKey   func(streamID int64, node string) string // SetNodeKey; nil: the node id
}

// Limits bound what one node, or every node together, may cost the server. Zero fields take the
// defaults (DefaultLimits).
type Limits struct {
	MaxNodeIDLength int       // bytes of a node id (default 253)
	MaxNodes        int       // nodes with an open stream (default 10,000; kds-host: --max-zones)
	MaxNACKMessage  int       // bytes of NACK text, and of each rejection's reason, kept (default 4 KiB; kds-host: --max-nack-message)
	ReRequests      RateLimit // how often a stream's re-requests are answered
	// MaxInFlightBytes bounds the bytes of responses sent and not answered yet, across every
	// stream (default 64 MiB). A larger response is sent alone; a response waits 5 s at most for
	// room (kds-host: --kds-max-inflight-bytes).
	MaxInFlightBytes int64
	// MaxUnknownNames bounds the names not held by the server that one stream subscribes to or
	// reports in initial_resource_versions (default 10,000): a request beyond it is refused with
	// ResourceExhausted, if it can be before its names are decoded (kds-host: --kds-max-unknown-names).
	MaxUnknownNames int
	// ResponseTimeout closes a DeltaADS stream whose oldest response stays unanswered this long
	// (default 30s; negative: never; kds-host: --kds-response-timeout).
	ResponseTimeout time.Duration
	// MaxMessage bounds one response, in bytes (default 16 MiB): a larger type is sent in several,
	// one at a time; a larger resource goes alone (kds-host: --kds-max-message).
	MaxMessage int
}

// DefaultLimits are the limits unless configured.
func DefaultLimits() Limits {
	return Limits{MaxNodeIDLength: 253, MaxNodes: 10_000, MaxNACKMessage: 4 << 10, ReRequests: DefaultReRequestLimit(), MaxInFlightBytes: 64 << 20,
		MaxMessage: 16 << 20, MaxUnknownNames: 10_000, ResponseTimeout: 30 * time.Second}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	orDefault(&l.MaxNodeIDLength, d.MaxNodeIDLength)
	orDefault(&l.MaxNodes, d.MaxNodes)
	orDefault(&l.MaxNACKMessage, d.MaxNACKMessage)
	orDefault(&l.MaxInFlightBytes, d.MaxInFlightBytes)
	orDefault(&l.MaxMessage, d.MaxMessage)
	orDefault(&l.MaxUnknownNames, d.MaxUnknownNames)
	if l.ResponseTimeout == 0 {
		l.ResponseTimeout = d.ResponseTimeout
	}
	if l.ReRequests.Rate <= 0 || l.ReRequests.Burst <= 0 {
		l.ReRequests = d.ReRequests
	}
	return l
}

func orDefault[T int | int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// NewTracker returns the callbacks for a delta server over cache.
func NewTracker(c *Cache, observers ...event.Observer) *Tracker {
	t := &Tracker{cache: c, observers: observers, limits: DefaultLimits()}
	c.responseTimeout.Store(int64(t.limits.ResponseTimeout))
	c.onStall = t.observers.Refused
	return t
}

// SetLimits sets the limits (zero fields: the defaults); call it before serving.
func (t *Tracker) SetLimits(l Limits) {
	t.limits = l.withDefaults()
	t.cache.budget.setLimit(t.limits.MaxInFlightBytes)
	t.cache.maxMessage.Store(int64(t.limits.MaxMessage))
	t.cache.responseTimeout.Store(int64(t.limits.ResponseTimeout))
	t.cache.maxUnknown.Store(int64(t.limits.MaxUnknownNames))
}

// SetCallbacksStallStreams makes the engine's own stream loop tell the observers of a request with
// the stream's lock held, as go-control-plane's server does: an observer that waits stalls the
// whole stream. It is for kds-host's --emulate alone. Call it before serving.
func (t *Tracker) SetCallbacksStallStreams() { t.stalls = true }

// SetNodeKey admits each stream as the node key(stream id, node id) names, bounded by
// Limits.MaxNodeIDLength (SotW stream ids are negated); a stream whose credentials name its node
// (DeltaADS) is admitted only when the key is that node. Call it before serving.
func (t *Tracker) SetNodeKey(key func(streamID int64, node string) string) { t.nodeKey = key }

// SetPlainCause sets the cause of the refusals of a NACK without a structured rejection list
// (default: unspecified, which the retry policy backs off and resends; an Envoy or grpc-go
// client's NACK is about content: event.CauseInvalid). Call it before serving.
func (t *Tracker) SetPlainCause(c event.Cause) { t.plain = c }

// refuse tells the observers of a refused stream (zone, its node: "" when not known).
func (t *Tracker) refuse(reason, zone string, err error) {
	t.observers.Refused(refusal(reason, zone, err))
}

// refusal is the refusal of a stream refused with err, a gRPC status error.
func refusal(reason, zone string, err error) event.Refusal {
	return event.Refusal{Reason: reason, Node: zone, Detail: status.Convert(err).Message()}
}

// OnDeltaStreamOpen implements delta.Callbacks.
func (t *Tracker) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	t.cache.openSession(id, streamInfoOf(ctx), false)
	return nil
}

// OnDeltaStreamClosed implements delta.Callbacks.
func (t *Tracker) OnDeltaStreamClosed(id int64, _ *core.Node) {
	if s := t.cache.closeStream(id); s != nil && s.Node() != "" {
		t.observers.StreamClosed(id, s.Node())
	}
}

// OnStreamDeltaRequest implements delta.Callbacks: it runs on the stream's goroutine before the
// server creates the request's watch.
func (t *Tracker) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	s := t.cache.Session(id)
	if s == nil {
		return status.Error(codes.Internal, "stream not open")
	}
	r, err := t.request(s, id, req)
	t.tell(&r)
	return err
}

// request is OnStreamDeltaRequest for session s; the caller tells r with no lock held.
func (t *Tracker) request(s *Session, id int64, req *discovery.DeltaDiscoveryRequest) (r told, err error) {
	return t.handle(s, id, incoming{
		node: req.GetNode().GetId(), typeURL: req.GetTypeUrl(), nonce: req.GetResponseNonce(), detail: req.GetErrorDetail(),
		subscribe: req.GetResourceNamesSubscribe(), initial: req.GetInitialResourceVersions(), delta: req,
	})
}

// incoming is a request of either protocol, as handle reads it.
type incoming struct {
	node, typeURL, nonce string
	detail               *rpcstatus.Status
	subscribe            []string          // delta: the names it subscribes to
	initial              map[string]string // delta: what the client holds, on a type's first request
	delta                *discovery.DeltaDiscoveryRequest
	sotw                 *discovery.DiscoveryRequest // when delta is nil
}

// told is what handle found to tell the observers once no lock is held: a value, allocating nothing.
type told struct {
	id                        int64
	node, typeURL             string
	refusals                  []event.Refusal
	reRequest, answer, opened bool
	names                     []string          // the re-request's
	initial                   map[string]string // a type's first request's initial_resource_versions
	acked                     bool
	ack                       event.ACK
	nack                      *event.NACK
}

// handle is a request of either protocol on the stream's session s: bounds, admission, ACK or
// NACK, re-request. It returns what to tell the observers (tell).
func (t *Tracker) handle(s *Session, id int64, in incoming) (r told, err error) {
	r.id = id
	node := s.Node()
	// The bounds first: a refused request stores nothing, and replaces no stream of its node.
	if in.delta != nil {
		err = t.bound(s, in.delta)
	} else {
		err = t.boundSotw(s, in.sotw)
	}
	if err != nil {
		r.refusals = append(r.refusals, refusal(refusalOf(err), nodeOf(s, node, in.node), err))
		return r, err
	}
	if node == "" {
		nodeID := in.node
		if t.nodeKey != nil {
			nodeID = t.nodeKey(id, nodeID)
		}
		n, err := t.admissible(s, nodeID)
		if err == nil {
			var replaced *Session
			replaced, err = t.cache.admit(s, n, t.limits.MaxNodes)
			if replaced != nil && replaced != s { // one stream per node: the newer one wins
				msg := fmt.Sprintf("this stream of node %q was replaced by a newer one of the same node (a restart, or a second client started with its name)", n)
				replaced.info.close(status.Error(codes.Aborted, msg))
				r.refusals = append(r.refusals, event.Refusal{Reason: "replaced", Node: n, Detail: msg})
			}
		}
		if err != nil {
			r.refusals = append(r.refusals, refusal(refusalOf(err), s.info.node, err))
			return r, err
		}
		node, r.opened = n, true
	}
	r.node, r.typeURL = node, in.typeURL

	s.mu.Lock()
	ks := s.kind(in.typeURL)
	first := !ks.requested
	ks.requested = true
	if first {
		r.initial = in.initial
	}
	var answered *inflight
	if in.nonce != "" {
		answered = s.byNonce(in.nonce)
	}
	// A request that answers nothing and subscribes names of a type already subscribed asks for
	// them again, answered as far as the rate limit allows.
	var again []string
	r.reRequest = !first && in.nonce == "" && len(in.subscribe) > 0
	if r.reRequest {
		r.names = in.subscribe
		r.answer = s.reRequests.allow(time.Now(), t.limits.ReRequests, len(in.subscribe))
	}
	if r.answer {
		again = in.subscribe
	}
	switch {
	case answered == nil:
	case in.detail == nil:
		// The event reads the response in place: it is told before the watch may reuse the record.
		r.acked = true
		r.ack = event.ACK{StreamID: id, Node: node, TypeURL: answered.kind, Versions: answered.view(), Removed: answered.resp.RemovedResources, Sent: answered.since}
		s.answerLocked(answered, nil)
	default:
		nack := nackOf(id, node, answered, in.detail, t.limits.MaxNACKMessage, t.plain)
		r.nack = &nack
		s.answerLocked(answered, r.nack)
	}
	if answered != nil && t.cache.withholder != nil {
		s.acceptedLocked(answered) // what waits for what it accepted or refused
	}
	s.mu.Unlock()

	if in.delta != nil {
		t.cache.bindRequest(s, in.delta, again)
	} else {
		t.cache.bindSotw(s, in.sotw)
	}
	return r, nil
}

// tell tells the observers what handle found.
func (t *Tracker) tell(r *told) {
	for _, rf := range r.refusals {
		t.observers.Refused(rf)
	}
	if r.reRequest {
		t.observers.ReRequest(event.ReRequest{StreamID: r.id, Node: r.node, TypeURL: r.typeURL, Names: r.names, Answered: r.answer})
	}
	if r.opened {
		t.observers.StreamOpened(r.id, r.node)
	}
	if len(r.initial) > 0 { // what the client already holds counts as ACKed
		t.observers.ACK(event.ACK{StreamID: r.id, Node: r.node, TypeURL: r.typeURL, Versions: event.VersionsOf(r.initial), Initial: true})
	}
	switch {
	case r.acked:
		t.observers.ACK(r.ack)
	case r.nack != nil:
		t.observers.NACK(*r.nack)
	}
}

// OnStreamDeltaResponse implements delta.Callbacks: it records the nonce of a response in flight.
func (t *Tracker) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	if s := t.cache.Session(id); s != nil {
		t.sentFlight(s, id, resp, nil)
	}
}

// sentFlight records resp sent on session s (flight: its record, nil when unknown) and tells the observers.
func (t *Tracker) sentFlight(s *Session, id int64, resp *discovery.DeltaDiscoveryResponse, flight *inflight) {
	s.mu.Lock()
	r := s.sentLocked(resp, flight)
	zone := s.node
	s.mu.Unlock()
	t.observers.Sent(sentOf(id, zone, r))
}

func sentOf(id int64, node string, r *inflight) event.Sent {
	return event.Sent{StreamID: id, Node: node, TypeURL: r.kind, Versions: r.view(), Removed: r.resp.GetRemovedResources()}
}

// nackOf reads a NACK of the response answered (nack.Read). A name a SotW full state carried
// again is refused only when the NACK names it, and is not counted accepted either.
func nackOf(id int64, zone string, answered *inflight, detail *rpcstatus.Status, maxText int, plain event.Cause) event.NACK {
	carried := make([]nack.Carried, len(answered.resp.Resources), len(answered.resp.Resources)+len(answered.again))
	for i, res := range answered.resp.Resources { // sorted by name
		prior := answered.prior(res.Name)
		carried[i] = nack.Carried{Name: res.Name, Version: res.Version, New: !prior.ok || prior.version != res.Version}
	}
	for _, nv := range answered.again {
		carried = append(carried, nack.Carried{Name: nv.name, Version: nv.version, Again: true})
	}
	for n, e := range answered.againAll {
		if _, sent := answered.Version(n); !sent {
			carried = append(carried, nack.Carried{Name: n, Version: e.Version, Again: true})
		}
	}
	if len(carried) > len(answered.resp.Resources) {
		slices.SortFunc(carried, func(a, b nack.Carried) int { return strings.Compare(a.Name, b.Name) })
	}
	n := event.NACK{StreamID: id, Node: zone, TypeURL: answered.kind, Accepted: map[string]string{}}
	n.Rejected, n.Detail = nack.Read(detail, carried, maxText, plain)
	rejected := make(map[string]bool, len(n.Rejected))
	for _, r := range n.Rejected {
		rejected[r.Name] = true
	}
	for _, res := range answered.resp.Resources {
		if !rejected[res.Name] {
			n.Accepted[res.Name] = res.Version
		}
	}
	return n
}

// admissible checks the node id of a stream's first request against its credentials.
func (t *Tracker) admissible(s *Session, node string) (string, error) {
	switch {
	case node == "":
		return "", status.Error(codes.InvalidArgument, "the first request must carry node.id, the zone name")
	case len(node) > t.limits.MaxNodeIDLength:
		return "", status.Errorf(codes.InvalidArgument, "node.id is %d bytes long; a zone name has at most %d", len(node), t.limits.MaxNodeIDLength)
	case s.info.node != "" && node != s.info.node:
		return "", status.Errorf(codes.PermissionDenied, "node.id %q is not the zone %q this stream's credentials name: start the zone with the token of its own name (kds-host token zone --name %s)",
			nack.Truncate(node, 64), s.info.node, nack.Truncate(node, 64))
	}
	return node, nil
}

// RateLimit is a token bucket: Rate tokens a second, at most Burst saved up.
type RateLimit struct {
	Rate  float64
	Burst int
}

// DefaultReRequestLimit is how many names a node's re-requests may ask for again unless
// configured: 20 a second, 40 at once.
func DefaultReRequestLimit() RateLimit { return RateLimit{Rate: 20, Burst: 40} }

// tokenBucket is one node's RateLimit state, shared by its streams. The zero value is full.
type tokenBucket struct {
	mu     sync.Mutex // guards tokens and last
	tokens float64
	last   time.Time // zero: never taken from
}

// allow takes n tokens (at least 1, at most a full bucket) if there are that many.
func (b *tokenBucket) allow(now time.Time, l RateLimit, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last.IsZero() {
		b.tokens, b.last = float64(l.Burst), now
	}
	b.tokens = min(float64(l.Burst), b.tokens+now.Sub(b.last).Seconds()*l.Rate)
	b.last = now
	cost := float64(min(max(n, 1), l.Burst))
	if b.tokens < cost {
		return false
	}
	b.tokens -= cost
	return true
}

// growStack grows the calling goroutine's stack to 8 KiB while it is shallow, so that it copies
// one frame instead of many on its first request (as CockroachDB's growstack does).
//
//go:noinline
func growStack() {
	var buf [5 << 10]byte
	keepFrame(buf[:])
}

// keepFrame makes growStack's buffer live, so that its frame keeps its size.
//
//go:noinline
func keepFrame(b []byte) { _ = b[len(b)-1] }

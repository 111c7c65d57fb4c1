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

// Tracker is the delta server's Callbacks: it opens and closes each stream's Session, admits
// the node a stream serves, pairs ACKs and NACKs with the response they answer (in the session),
// and tells its observers. It keeps no state of its own beyond its limits.
type Tracker struct {
	cache     *Cache
	observers event.Observers
	limits    Limits
	plain     event.Cause // of a refusal read from a NACK without a structured list
	// stalls: the observers are told as go-control-plane's server calls its callbacks, on the
	// stream's one goroutine with nothing else of the stream going on (SetCallbacksStallStreams).
	stalls bool
	// nodeKey, if set, is the node a stream is admitted as (SetNodeKey).
	nodeKey func(streamID int64, node string) string
}

// Limits bound what one node, or every node together, may cost the server. Zero fields take the
// defaults (DefaultLimits).
type Limits struct {
	// MaxNodeIDLength bounds a node id, in bytes (default 253).
	MaxNodeIDLength int
	// MaxNodes bounds the nodes with an open stream (default 10,000; kds-host: --max-zones).
	MaxNodes int
	// MaxNACKMessage bounds the NACK text kept and passed on, in bytes (default 4 KiB); a
	// longer one is truncated, and so is each rejection's reason (kds-host: --max-nack-message).
	MaxNACKMessage int
	// ReRequests bounds how often a stream's re-requests are answered.
	ReRequests RateLimit
	// MaxInFlightBytes bounds the bytes of the responses sent to clients and not answered yet,
	// across every stream (default 64 MiB): a full sync of many nodes is sent a few nodes at a
	// time instead of every node's whole state encoded at once. A response larger than the limit
	// is sent alone; one waits 5 s at most for room (kds-host: --kds-max-inflight-bytes).
	MaxInFlightBytes int64
	// MaxUnknownNames bounds the names one stream subscribes to, or reports holding in a type's
	// initial_resource_versions, that the server does not hold (default 10,000): beyond it the
	// request is refused (ResourceExhausted) and counted, so made-up names cannot grow the
	// server's memory. A request that names more than this and the largest type's size is
	// refused before its names are decoded (Cache.Codec). (kds-host: --kds-max-unknown-names.)
	MaxUnknownNames int
	// ResponseTimeout closes a stream whose oldest response stays unanswered this long (default
	// 30s; negative: never): a client that stops reading, its window full, holds what it was sent
	// until then, and no longer. Only streams of the engine's own loop (DeltaADS) are closed.
	// (kds-host: --kds-response-timeout.)
	ResponseTimeout time.Duration
	// MaxMessage bounds one response, in bytes (default 16 MiB; clients must accept that much): a
	// type whose resources take more goes in as many responses as it takes, each sent once the
	// client answered the one before. A single resource larger than the limit goes alone.
	// (kds-host: --kds-max-message, under its zones' 64 MiB receive limit; its API refuses a
	// larger resource.)
	MaxMessage int
}

// DefaultLimits are the limits unless configured.
func DefaultLimits() Limits {
	return Limits{MaxNodeIDLength: 253, MaxNodes: 10_000, MaxNACKMessage: 4 << 10, ReRequests: DefaultReRequestLimit(), MaxInFlightBytes: 64 << 20,
		MaxMessage: 16 << 20, MaxUnknownNames: 10_000, ResponseTimeout: 30 * time.Second}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxNodeIDLength <= 0 {
		l.MaxNodeIDLength = d.MaxNodeIDLength
	}
	if l.MaxNodes <= 0 {
		l.MaxNodes = d.MaxNodes
	}
	if l.MaxNACKMessage <= 0 {
		l.MaxNACKMessage = d.MaxNACKMessage
	}
	if l.MaxInFlightBytes <= 0 {
		l.MaxInFlightBytes = d.MaxInFlightBytes
	}
	if l.MaxMessage <= 0 {
		l.MaxMessage = d.MaxMessage
	}
	if l.MaxUnknownNames <= 0 {
		l.MaxUnknownNames = d.MaxUnknownNames
	}
	if l.ResponseTimeout == 0 {
		l.ResponseTimeout = d.ResponseTimeout
	}
	if l.ReRequests.Rate <= 0 || l.ReRequests.Burst <= 0 {
		l.ReRequests = d.ReRequests
	}
	return l
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
// the stream's lock held, as go-control-plane's server calls its callbacks on the stream's one
// goroutine: an observer that waits then stalls every type of the stream, sends included. It is
// for kds-host's emulation of the old, blocking retry (--emulate) alone. Call it before serving.
func (t *Tracker) SetCallbacksStallStreams() { t.stalls = true }

// SetNodeKey makes each stream admitted as the node key(stream id, its node id) says, instead of
// its node id (which may then be empty; Limits.MaxNodeIDLength bounds the key): what the cache
// keeps by node (the current session, its snapshot, its insight, its re-request budget) is then
// kept by key. A key per stream lets a node's streams be served side by side, none replacing
// another (SotW stream ids are negated). It is for streams go-control-plane's server serves: a
// stream whose credentials name its node (the engine's own DeltaADS) is admitted only when the
// key is that node. Call it before serving.
func (t *Tracker) SetNodeKey(key func(streamID int64, node string) string) { t.nodeKey = key }

// SetPlainCause sets the cause of the refusals of a NACK without a structured rejection list
// (default: unspecified, which the retry policy backs off and resends, as a client that cannot
// say why may refuse for a passing reason; an Envoy or grpc-go client's NACK is about content:
// event.CauseInvalid). Call it before serving.
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
	if s := t.cache.closeStream(id); s != nil {
		if zone := s.Node(); zone != "" {
			t.observers.StreamClosed(id, zone)
		}
	}
}

// OnStreamDeltaRequest implements delta.Callbacks: it runs on the stream's goroutine before the
// server creates the request's watch.
func (t *Tracker) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	s := t.cache.Session(id)
	if s == nil {
		return status.Error(codes.Internal, "stream not open")
	}
	tell, err := t.request(s, id, req)
	tell()
	return err
}

// request is OnStreamDeltaRequest for the stream's session s (the engine's own stream loop holds
// it), but for the observers: it returns tell, which tells them what the request did, in order,
// and which the caller calls with no lock held (the engine's own stream loop tells them in the
// order of its sends).
func (t *Tracker) request(s *Session, id int64, req *discovery.DeltaDiscoveryRequest) (tell func(), err error) {
	return t.handle(s, id, incoming{
		node: req.GetNode().GetId(), typeURL: req.GetTypeUrl(), nonce: req.GetResponseNonce(), detail: req.GetErrorDetail(),
		subscribe: req.GetResourceNamesSubscribe(), initial: req.GetInitialResourceVersions(),
		bound: func() error { return t.bound(s, req) },
		bind:  func(again []string) { t.cache.bindRequest(s, req, again) },
	})
}

// incoming is a request of either protocol, as handle reads it.
type incoming struct {
	node, typeURL, nonce string
	detail               *rpcstatus.Status
	subscribe            []string          // delta: the names it subscribes to (a re-request when it answers nothing)
	initial              map[string]string // delta: what the client holds, on a type's first request
	bound                func() error      // checks the stream's bounds
	bind                 func(again []string)
}

// handle is a request of either protocol on the stream's session s: its bounds, the node's
// admission on the stream's first request, the answer (ACK or NACK) to the response it names,
// and a re-request; it returns what to tell the observers (request).
func (t *Tracker) handle(s *Session, id int64, in incoming) (tell func(), err error) {
	var refusals []event.Refusal
	tellRefusals := func() {
		for _, r := range refusals {
			t.observers.Refused(r)
		}
	}
	node := s.Node()
	// The bounds first: a refused request stores nothing, and replaces no stream of its node.
	if err := in.bound(); err != nil {
		refusals = append(refusals, refusal(refusalOf(err), nodeOf(s, node, in.node), err))
		return tellRefusals, err
	}
	opened := false
	if node == "" {
		nodeID := in.node
		if t.nodeKey != nil {
			nodeID = t.nodeKey(id, nodeID) // a key of its own, whatever the node id (none included)
		}
		n, err := t.admissible(s, nodeID)
		if err == nil {
			var replaced *Session
			replaced, err = t.cache.admit(s, n, t.limits.MaxNodes)
			if replaced != nil && replaced != s {
				// One stream per node: the newer one wins, and the older is told why it ends.
				msg := fmt.Sprintf("this stream of node %q was replaced by a newer one of the same node (a restart, or a second client started with its name)", n)
				replaced.info.close(status.Error(codes.Aborted, msg))
				refusals = append(refusals, event.Refusal{Reason: "replaced", Node: n, Detail: msg})
			}
		}
		if err != nil {
			refusals = append(refusals, refusal(refusalOf(err), s.info.node, err))
			return tellRefusals, err
		}
		node, opened = n, true
	}
	typeURL := in.typeURL

	s.mu.Lock()
	ks := s.kind(typeURL)
	first := !ks.requested
	ks.requested = true
	var answered *inflight
	if in.nonce != "" {
		answered = s.byNonce(in.nonce)
	}
	// A request that answers no response and subscribes names of a type already subscribed is
	// the node asking for them again (their cause cleared): they are sent again at once, as
	// far as the stream's rate limit allows.
	var again []string
	reRequest := !first && in.nonce == "" && len(in.subscribe) > 0
	answer := reRequest && s.reRequests.allow(time.Now(), t.limits.ReRequests, len(in.subscribe))
	if answer {
		again = in.subscribe
	}
	var nack event.NACK
	var ack event.ACK
	switch {
	case answered == nil:
	case in.detail == nil:
		// The event reads the response in place: the ACK is told before the watch that may
		// reuse its record is opened again (the stream loop's request), or the observers copy.
		ack = event.ACK{StreamID: id, Node: node, TypeURL: answered.kind, Versions: answered.view(), Removed: answered.resp.RemovedResources, Sent: answered.since}
		s.answerLocked(answered, nil)
		if t.cache.withholder != nil {
			s.acceptedLocked(answered.kind, answered.names())
		}
	default:
		nack = nackOf(id, node, answered, in.detail, t.limits.MaxNACKMessage, t.plain)
		s.answerLocked(answered, &nack)
		if t.cache.withholder != nil {
			// What it accepted, and what it refused: what waits for either is looked at again.
			s.acceptedLocked(answered.kind, answered.names())
		}
	}
	s.mu.Unlock()

	in.bind(again)
	return func() {
		tellRefusals()
		if reRequest {
			t.observers.ReRequest(event.ReRequest{StreamID: id, Node: node, TypeURL: typeURL, Names: in.subscribe, Answered: answer})
		}
		if opened {
			t.observers.StreamOpened(id, node)
		}
		if first && len(in.initial) > 0 {
			// What the client already holds counts as ACKed.
			t.observers.ACK(event.ACK{StreamID: id, Node: node, TypeURL: typeURL, Versions: event.VersionsOf(in.initial), Initial: true})
		}
		switch {
		case answered == nil:
		case in.detail == nil:
			t.observers.ACK(ack)
		default:
			t.observers.NACK(nack)
		}
	}, nil
}

// OnStreamDeltaResponse implements delta.Callbacks: it records the nonce of a response in
// flight (the session counted it when its sender handed it over).
func (t *Tracker) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	if s := t.cache.Session(id); s != nil {
		t.sent(s, id, resp)
	}
}

// sent is OnStreamDeltaResponse for the stream's session s.
func (t *Tracker) sent(s *Session, id int64, resp *discovery.DeltaDiscoveryResponse) {
	t.sentFlight(s, id, resp, nil)
}

// sentFlight is sent for a response the engine's own stream loop handed over, with its record in
// the session (flight, nil when unknown).
func (t *Tracker) sentFlight(s *Session, id int64, resp *discovery.DeltaDiscoveryResponse, flight *inflight) {
	s.mu.Lock()
	r := s.sentLocked(resp, flight)
	zone := s.node
	s.mu.Unlock()
	t.observers.Sent(sentOf(id, zone, r))
}

// sentOf is the event of r sent on stream id of node.
func sentOf(id int64, node string, r *inflight) event.Sent {
	return event.Sent{StreamID: id, Node: node, TypeURL: r.kind, Versions: r.view(), Removed: r.resp.GetRemovedResources()}
}

// nackOf reads a NACK of the response answered (nack.Read): the node's structured rejection
// list when error_detail carries one, or else what its message names, or else what the response
// brought new. A SotW full state is read whole: a name it carried again (a refusal of it on its
// way when it was made) is refused when the NACK names it, and is never blamed for a NACK that
// names nothing it carried; it is not counted accepted either (the client holds it as before).
func nackOf(id int64, zone string, answered *inflight, detail *rpcstatus.Status, maxText int, plain event.Cause) event.NACK {
	carried := make([]nack.Carried, len(answered.resp.Resources), len(answered.resp.Resources)+len(answered.again))
	for i, res := range answered.resp.Resources { // sorted by name
		prior := answered.prior(res.Name)
		carried[i] = nack.Carried{Name: res.Name, Version: res.Version, New: !prior.ok || prior.version != res.Version}
	}
	if len(answered.again) > 0 {
		for _, nv := range answered.again {
			carried = append(carried, nack.Carried{Name: nv.name, Version: nv.version, Again: true})
		}
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

// admissible checks the first request of a stream: its node id names the node, which must be
// the node its credentials prove. It returns the node id, or a gRPC status error that says what
// is wrong.
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

// tokenBucket is one node's RateLimit state, shared by its streams (a node that reconnects
// finds it as it left it). The zero value is a full bucket.
type tokenBucket struct {
	mu      sync.Mutex // guards started, tokens and last
	started bool
	tokens  float64
	last    time.Time
}

// allow takes n tokens (a request's names; at most a full bucket) if there are that many.
func (b *tokenBucket) allow(now time.Time, l RateLimit, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.started {
		b.started, b.tokens, b.last = true, float64(l.Burst), now
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

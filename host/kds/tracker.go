package kds

import (
	"context"
	"sort"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kds-host/kds-host/host/event"
	"github.com/kds-host/kds-host/host/resource"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// Tracker is the delta server's Callbacks: it binds requests to streams for the Cache, pairs
// ACKs and NACKs with the response they answer, and tells its observers.
type Tracker struct {
	cache     *Cache
	observers event.Observers
	reLimit   RateLimit

	mu      sync.Mutex
	streams map[int64]*trackedStream
}

type trackedStream struct {
	zone       string
	sent       map[string]sentResponse // by nonce
	kinds      map[string]bool         // kinds requested so far
	reRequests tokenBucket
}

type sentResponse struct {
	kind     string
	versions map[string]string
	removed  []string
}

// NewTracker returns the callbacks for a delta server over cache.
func NewTracker(c *Cache, observers ...event.Observer) *Tracker {
	return &Tracker{cache: c, observers: observers, streams: map[int64]*trackedStream{}, reLimit: DefaultReRequestLimit()}
}

// LimitReRequests sets how often a stream's re-requests are answered (DefaultReRequestLimit
// unless set); call it before serving.
func (t *Tracker) LimitReRequests(l RateLimit) { t.reLimit = l }

// OnDeltaStreamOpen implements delta.Callbacks.
func (t *Tracker) OnDeltaStreamOpen(_ context.Context, id int64, _ string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams[id] = &trackedStream{sent: map[string]sentResponse{}, kinds: map[string]bool{}}
	return nil
}

// OnDeltaStreamClosed implements delta.Callbacks.
func (t *Tracker) OnDeltaStreamClosed(id int64, _ *core.Node) {
	t.mu.Lock()
	ts := t.streams[id]
	delete(t.streams, id)
	t.mu.Unlock()
	t.cache.closeStream(id)
	if ts != nil && ts.zone != "" {
		t.observers.StreamClosed(id, ts.zone)
	}
}

// OnStreamDeltaRequest implements delta.Callbacks: it runs on the stream's goroutine before the
// server creates the request's watch.
func (t *Tracker) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	t.mu.Lock()
	ts := t.streams[id]
	if ts == nil {
		t.mu.Unlock()
		return status.Error(codes.Internal, "stream not open")
	}
	opened := false
	if ts.zone == "" {
		ts.zone = req.GetNode().GetId()
		if ts.zone == "" {
			t.mu.Unlock()
			return status.Error(codes.InvalidArgument, "the first request must carry node.id, the zone name")
		}
		opened = true
	}
	zone := ts.zone
	kind := req.GetTypeUrl()
	if kind == "" {
		t.mu.Unlock()
		return status.Error(codes.InvalidArgument, "type_url is required: KDS is ADS, one type per kind")
	}
	first := !ts.kinds[kind]
	ts.kinds[kind] = true
	var answered sentResponse
	var ok bool
	if nonce := req.GetResponseNonce(); nonce != "" {
		answered, ok = ts.sent[nonce]
		delete(ts.sent, nonce)
	}
	// A request that answers no response and subscribes names of a kind already subscribed is
	// the zone asking for them again (their cause cleared): they are sent again at once, as far
	// as the stream's rate limit allows.
	var again []string
	reRequest := !first && req.GetResponseNonce() == "" && len(req.GetResourceNamesSubscribe()) > 0
	answer := reRequest && ts.reRequests.allow(time.Now(), t.reLimit)
	if answer {
		again = req.GetResourceNamesSubscribe()
	}
	t.mu.Unlock()

	t.cache.bindRequest(id, zone, req, again)
	if reRequest {
		t.observers.ReRequest(event.ReRequest{StreamID: id, Zone: zone, Kind: kind, Names: req.GetResourceNamesSubscribe(), Answered: answer})
	}
	if opened {
		t.observers.StreamOpened(id, zone)
	}
	if first && len(req.GetInitialResourceVersions()) > 0 {
		// What the zone already holds counts as ACKed.
		t.observers.ACK(event.ACK{StreamID: id, Zone: zone, Kind: kind, Versions: req.GetInitialResourceVersions(), Initial: true})
	}
	if !ok {
		return nil
	}
	if req.GetErrorDetail() == nil {
		t.observers.ACK(event.ACK{StreamID: id, Zone: zone, Kind: answered.kind, Versions: answered.versions, Removed: answered.removed})
		return nil
	}
	t.observers.NACK(nackOf(id, zone, answered, req.GetErrorDetail()))
	return nil
}

// OnStreamDeltaResponse implements delta.Callbacks: it records what a nonce carried.
func (t *Tracker) OnStreamDeltaResponse(id int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	versions := make(map[string]string, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		versions[r.GetName()] = r.GetVersion()
	}
	t.mu.Lock()
	ts := t.streams[id]
	if ts == nil {
		t.mu.Unlock()
		return
	}
	ts.sent[resp.GetNonce()] = sentResponse{kind: resp.GetTypeUrl(), versions: versions, removed: resp.GetRemovedResources()}
	zone := ts.zone
	t.mu.Unlock()
	t.observers.Sent(event.Sent{StreamID: id, Zone: zone, Kind: resp.GetTypeUrl(), Versions: versions, Removed: resp.GetRemovedResources()})
}

// nackOf reads a NACK: the zone's structured rejection list when error_detail carries one, or
// else every resource of the response as rejected with the error message.
func nackOf(id int64, zone string, answered sentResponse, detail *rpcstatus.Status) event.NACK {
	n := event.NACK{StreamID: id, Zone: zone, Kind: answered.kind, Detail: detail.GetMessage(), Accepted: map[string]string{}}
	list := RejectionListOf(detail)
	if list == nil {
		for name := range answered.versions {
			n.Rejected = append(n.Rejected, event.Rejection{Name: name, Version: answered.versions[name], Reason: n.Detail})
		}
		sort.Slice(n.Rejected, func(i, j int) bool { return n.Rejected[i].Name < n.Rejected[j].Name })
		return n
	}
	rejected := map[string]bool{}
	for _, r := range list.GetRejections() {
		version, sent := answered.versions[r.GetName()]
		if !sent {
			continue // not in the response it answers: nothing to resend
		}
		rj := event.Rejection{Name: r.GetName(), Version: version, Reason: r.GetReason(), Cause: causeOf(r.GetCause())}
		if mo := r.GetMissingOwner(); mo != nil {
			rj.MissingOwner = resource.Key{Kind: mo.GetKind(), Mesh: mo.GetMesh(), Name: mo.GetName()}.String()
			if rj.Cause == event.CauseUnspecified {
				rj.Cause = event.CauseMissingOwner // a zone that names the owner but predates causes
			}
		}
		n.Rejected = append(n.Rejected, rj)
		rejected[r.GetName()] = true
	}
	for name, v := range answered.versions {
		if !rejected[name] {
			n.Accepted[name] = v
		}
	}
	return n
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

// RateLimit is a token bucket: Rate tokens a second, at most Burst saved up.
type RateLimit struct {
	Rate  float64
	Burst int
}

// DefaultReRequestLimit is how often a stream's re-requests are answered unless configured:
// 20 a second, 40 at once.
func DefaultReRequestLimit() RateLimit { return RateLimit{Rate: 20, Burst: 40} }

// tokenBucket is one stream's RateLimit state. The zero value is a full bucket.
type tokenBucket struct {
	started bool
	tokens  float64
	last    time.Time
}

// allow takes a token if there is one.
func (b *tokenBucket) allow(now time.Time, l RateLimit) bool {
	if !b.started {
		b.started, b.tokens, b.last = true, float64(l.Burst), now
	}
	b.tokens = min(float64(l.Burst), b.tokens+now.Sub(b.last).Seconds()*l.Rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
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

// NACKDetail builds the error_detail a zone sends: a message a person reads, and the structured
// rejection list the global acts on.
func NACKDetail(list *kdsv1.RejectionList, message string) (*rpcstatus.Status, error) {
	a, err := anypb.New(list)
	if err != nil {
		return nil, err
	}
	return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: message, Details: []*anypb.Any{a}}, nil
}

package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// ADSConfig is how DeltaADS serves. The zero value serves every stream, unauthenticated.
type ADSConfig struct {
	// Authenticate names the node a stream's credentials prove (a token in its metadata, or its
	// client certificate), or refuses the stream with a gRPC status error (Unauthenticated,
	// PermissionDenied). Nil accepts every stream as whatever node its node id names.
	Authenticate func(ctx context.Context) (node string, err error)
	// Header is sent to each stream before anything else.
	Header metadata.MD
	// Conns, when set, registers the server's connections (serve with its Creds): a stream that
	// the response timeout closes has its connection dropped, which ends it for the client and
	// frees what gRPC holds for it. Nil: the stream is closed only.
	Conns *Conns
	// Arrivals bounds how fast new streams are served, after they authenticate (a zero Rate: no
	// bound): a stream beyond the rate waits its turn, unless its turn is more than ArrivalWait
	// (default 10s) away, when it is refused at once with Unavailable, counted as a refusal
	// ("arrivals"), and its client comes back after its backoff. The streams already served are
	// not slowed by a fleet that arrives at once (the clients of a replica that died).
	Arrivals    RateLimit
	ArrivalWait time.Duration
}

// DeltaADS is the delta half of the Aggregated Discovery Service served from c by the engine's
// own stream loop, with t as its callbacks, until ctx ends. Register it on a gRPC server that
// uses c.Codec().
func (c *Cache) DeltaADS(ctx context.Context, t *Tracker, cfg ADSConfig) discovery.AggregatedDiscoveryServiceServer {
	a := &ads{ctx: ctx, cache: c, tracker: t, cfg: cfg}
	if cfg.Arrivals.Rate > 0 {
		a.arrivals = rate.NewLimiter(rate.Limit(cfg.Arrivals.Rate), max(cfg.Arrivals.Burst, 1))
		if a.cfg.ArrivalWait <= 0 {
			a.cfg.ArrivalWait = DefaultArrivalWait
		}
	}
	return a
}

// DefaultArrivalWait is how long a new stream waits for its turn under ADSConfig.Arrivals
// unless configured.
const DefaultArrivalWait = 10 * time.Second

// arrive waits for the stream's turn under ADSConfig.Arrivals, or refuses it when its turn is
// more than ArrivalWait away (or the stream ends first).
func (a *ads) arrive(ctx context.Context, node string) error {
	if a.arrivals == nil {
		return nil
	}
	r := a.arrivals.Reserve()
	wait := r.Delay()
	if wait == 0 {
		return nil
	}
	err := status.Errorf(codes.Unavailable, "too many streams are arriving at once (more than %g a second): connect again after a backoff", a.cfg.Arrivals.Rate)
	if wait > a.cfg.ArrivalWait {
		r.Cancel()
		a.tracker.refuse("arrivals", node, err)
		return err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.Cancel()
		return status.FromContextError(ctx.Err()).Err()
	}
}

// StreamAggregatedResources refuses a SotW stream: this loop serves delta xDS only.
func (a *ads) StreamAggregatedResources(discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return status.Error(codes.Unimplemented, "this server serves delta xDS only: use DeltaAggregatedResources (a client's delta ADS), or serve the cache with go-control-plane's server for state-of-the-world clients")
}

// ads serves the delta half of the Aggregated Discovery Service.
type ads struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	ctx     context.Context // the server's: streams end with it
	cache   *Cache
	streams atomic.Int64 // the last stream id given
	tracker *Tracker
	cfg     ADSConfig

	arrivals *rate.Limiter // ADSConfig.Arrivals' (nil: no bound)
}

// DeltaAggregatedResources authenticates the stream, and serves it as a stream that the tracker
// can close (a newer stream of the same node replaces it): its end then carries the reason.
func (a *ads) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	growStack()
	zone := ""
	if a.cfg.Authenticate != nil {
		z, err := a.cfg.Authenticate(s.Context())
		if err != nil {
			a.tracker.refuse(refusalOf(err), "", err)
			return err
		}
		zone = z
	}
	if err := a.arrive(s.Context(), zone); err != nil {
		return err
	}
	if len(a.cfg.Header) > 0 {
		if err := s.SendHeader(a.cfg.Header); err != nil {
			return err
		}
	}
	// The stream ends with the status the server closes it with: grpc-go's server stream writes
	// it and cancels the stream, whose Recv and Send then return at once, even while the loop
	// waits for the client's next request. (A handler's returned status comes too late for that:
	// the Recv that the cancel ends writes its own, "context canceled", first.)
	ts, ok := grpc.ServerTransportStreamFromContext(s.Context()).(statusWriter)
	if !ok {
		return status.Error(codes.Internal, "the stream cannot be ended with a status: serve KDS with NewGRPCServer")
	}
	ctx, cancel := context.WithCancelCause(s.Context())
	defer cancel(nil)
	end := func(cause error) {
		cancel(cause)
		_ = ts.WriteStatus(status.Convert(cause)) // fails only once the stream has ended
	}
	stop := context.AfterFunc(a.ctx, func() { end(status.Error(codes.Unavailable, "the control plane is stopping")) })
	defer stop()
	info := &streamInfo{node: zone, conn: connOf(s.Context()), close: end, loop: true}
	if a.cfg.Conns != nil {
		info.drop = func() bool { return a.cfg.Conns.Drop(info.conn) }
	}
	ctx = context.WithValue(ctx, streamKey{}, info)
	err := serveDelta(ctx, a.streams.Add(1), s, a.cache, a.tracker)
	if err == nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause // closed by the tracker, or the cache closing: the client was told why
		}
	}
	return err // the loop's own error first
}

// connOf names a stream's connection by its peer's address ("" when unknown).
func connOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// statusWriter is grpc-go's server stream (grpc.ServerTransportStreamFromContext's), which
// ends the RPC with a status and cancels its context: what a handler's return does, from
// another goroutine. TestAClosedStreamEndsWithItsStatus holds grpc-go to it.
type statusWriter interface {
	WriteStatus(*status.Status) error
}

// refusalOf names, for the refusals metric, why a stream was refused.
func refusalOf(err error) string {
	switch status.Code(err) {
	case codes.Unauthenticated:
		return "unauthenticated"
	case codes.PermissionDenied:
		return "permission_denied"
	case codes.ResourceExhausted:
		return "limit"
	case codes.InvalidArgument:
		return "invalid"
	}
	return "other"
}

// streamKey is the context key of a stream's streamInfo.
type streamKey struct{}

// streamInfo is what the server knows of a stream before the callbacks do: the node its
// credentials prove ("" unauthenticated), and how to close it.
type streamInfo struct {
	node  string
	conn  string // the peer's address: the same for the streams of one connection
	close context.CancelCauseFunc
	drop  func() bool // drops the stream's connection, and reports whether it could (nil: it cannot)
	loop  bool        // served by the engine's own loop (stream.go), which sends the session's responses
}

func streamInfoOf(ctx context.Context) *streamInfo {
	si, _ := ctx.Value(streamKey{}).(*streamInfo)
	if si == nil {
		return &streamInfo{close: func(error) {}}
	}
	return si
}

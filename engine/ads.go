package engine

import (
	"cmp"
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
	// the response timeout closes has its connection dropped too.
	Conns *Conns
	// Arrivals bounds how fast new streams are served, after they authenticate (a zero Rate: no
	// bound): a stream beyond the rate waits its turn, or is refused with Unavailable (a refusal,
	// "arrivals") when its turn is more than ArrivalWait (default DefaultArrivalWait) away.
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

// DefaultArrivalWait is ADSConfig.ArrivalWait unless configured.
const DefaultArrivalWait = 10 * time.Second

// arrive waits for the stream's turn under ADSConfig.Arrivals, or refuses it.
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
	ctx      context.Context // the server's: streams end with it
	cache    *Cache
	streams  atomic.Int64 // the last stream id given
	tracker  *Tracker
	cfg      ADSConfig
	arrivals *rate.Limiter // nil: no bound
}

// DeltaAggregatedResources authenticates the stream and serves it until it ends or is closed
// (its end then carries the reason).
func (a *ads) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	growStack()
	var zone string
	var err error
	if a.cfg.Authenticate != nil {
		if zone, err = a.cfg.Authenticate(s.Context()); err != nil {
			a.tracker.refuse(refusalOf(err), "", err)
			return err
		}
	}
	if err = a.arrive(s.Context(), zone); err != nil {
		return err
	}
	if len(a.cfg.Header) > 0 {
		if err := s.SendHeader(a.cfg.Header); err != nil {
			return err
		}
	}
	// Closed with a status, the stream ends at once with it: WriteStatus ends its Recv and Send.
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
	info := &streamInfo{node: zone, close: end, loop: true}
	if p, ok := peer.FromContext(s.Context()); ok && p.Addr != nil {
		info.conn = p.Addr.String()
	}
	if a.cfg.Conns != nil {
		info.drop = func() bool { return a.cfg.Conns.Drop(info.conn) }
	}
	ctx = context.WithValue(ctx, streamKey{}, info)
	err = serveDelta(ctx, a.streams.Add(1), s, a.cache, a.tracker)
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // closed by the tracker, or the cache closing: the client was told why
	}
	return err // the loop's own error first
}

// statusWriter is grpc-go's server stream, which ends the RPC with a status from any goroutine.
type statusWriter interface {
	WriteStatus(*status.Status) error
}

// refusals names, for the refusals metric, why a stream was refused by its status code.
var refusals = map[codes.Code]string{codes.Unauthenticated: "unauthenticated", codes.PermissionDenied: "permission_denied",
	codes.ResourceExhausted: "limit", codes.InvalidArgument: "invalid"}

func refusalOf(err error) string { return cmp.Or(refusals[status.Code(err)], "other") }

// streamKey is the context key of a stream's streamInfo.
type streamKey struct{}

// streamInfo is what the server knows of a stream before the callbacks do.
type streamInfo struct {
	node  string // the node its credentials prove ("" unauthenticated)
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

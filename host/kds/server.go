package kds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// ServerConfig is how NewGRPCServer serves. The zero value serves plaintext, unauthenticated.
type ServerConfig struct {
	// TLS serves KDS over TLS; nil serves plaintext.
	TLS *tls.Config
	// Authenticate names the zone a stream's credentials prove (a token in its metadata, or its
	// client certificate), or refuses the stream with a gRPC status error (Unauthenticated,
	// PermissionDenied). Nil accepts every stream as whatever zone its node id names.
	Authenticate func(ctx context.Context) (zone string, err error)
	// Header is sent to each stream before anything else (the store id, for the zone).
	Header metadata.MD
	// MaxStreamsPerConnection bounds the streams one connection may have open (default 16: a
	// zone needs one KDS stream and a health check).
	MaxStreamsPerConnection uint32
	// Conns, when set, registers the server's connections: a stream that the response timeout
	// closes has its connection dropped, which ends it for the zone and frees what gRPC holds for
	// it. Nil: the stream is closed only.
	Conns *Conns
	// MaxRequestBytes bounds one message a client sends (default DefaultMaxRequestBytes): gRPC
	// refuses a larger one as its bytes arrive, before it is decoded, and the stream ends with
	// ResourceExhausted, counted as a refusal.
	MaxRequestBytes int
}

// ServerWindow is the KDS server's flow-control window, a stream's and a connection's.
const ServerWindow = 1 << 20

// NewGRPCServer returns a gRPC server that serves KDS (ADS, delta only) from cache through
// go-control-plane's delta server, with tracker as its callbacks, and grpc.health.v1. The server
// stops serving streams when ctx ends.
func NewGRPCServer(ctx context.Context, c *Cache, t *Tracker, cfg ServerConfig) (*grpc.Server, *health.Server) {
	if cfg.MaxStreamsPerConnection == 0 {
		cfg.MaxStreamsPerConnection = 16
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		// A version's resources are encoded once, by the snapshot, for every stream (codec.go).
		grpc.ForceServerCodecV2(c.Codec()),
		grpc.MaxConcurrentStreams(cfg.MaxStreamsPerConnection),
		// Fixed flow-control windows: what a zone sends the global is requests and ACKs, and
		// with a dynamic window grpc-go probes the bandwidth-delay product with a PING after
		// data it receives, which the zone answers: reads and writes a stream a write, for
		// nothing. 1 MiB also bounds what a client can make the server hold unread below the
		// 16 MiB a dynamic window grows to.
		grpc.StaticStreamWindowSize(ServerWindow), grpc.StaticConnWindowSize(ServerWindow),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Zones ping every 10s at most (zone.Keepalive, gRPC's minimum): allowed with room.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	var creds credentials.TransportCredentials
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	if cfg.Conns != nil {
		creds = cfg.Conns.Creds(creds)
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s, &ads{ctx: ctx, cache: c, tracker: t, cfg: cfg})
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until the caller says so
	healthpb.RegisterHealthServer(s, h)
	return s, h
}

// ads serves the delta half of the Aggregated Discovery Service.
type ads struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	ctx     context.Context // the server's: streams end with it
	cache   *Cache
	streams atomic.Int64 // the last stream id given
	tracker *Tracker
	cfg     ServerConfig
}

// DeltaAggregatedResources authenticates the stream, and serves it as a stream that the tracker
// can close (a newer stream of the same zone replaces it): its end then carries the reason.
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
	if len(a.cfg.Header) > 0 {
		if err := s.SendHeader(a.cfg.Header); err != nil {
			return err
		}
	}
	// The stream ends with the status the server closes it with: grpc-go's server stream writes
	// it and cancels the stream, whose Recv and Send then return at once, even while the loop
	// waits for the zone's next request. (A handler's returned status comes too late for that:
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
	info := &streamInfo{zone: zone, conn: connOf(s.Context()), close: end, loop: true}
	if a.cfg.Conns != nil {
		info.drop = func() bool { return a.cfg.Conns.Drop(info.conn) }
	}
	ctx = context.WithValue(ctx, streamKey{}, info)
	err := serveDelta(ctx, a.streams.Add(1), s, a.cache, a.tracker)
	if err == nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause // closed by the tracker, or the cache closing: the zone was told why
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

// streamInfo is what the server knows of a stream before the callbacks do: the zone its
// credentials prove ("" unauthenticated), and how to close it.
type streamInfo struct {
	zone  string
	conn  string // the peer's address: the same for the streams of one connection
	close context.CancelCauseFunc
	drop  func() bool // drops the stream's connection, and reports whether it could (nil: it cannot)
	loop  bool        // served by kds's own loop (stream.go), which sends the session's responses
}

func streamInfoOf(ctx context.Context) *streamInfo {
	si, _ := ctx.Value(streamKey{}).(*streamInfo)
	if si == nil {
		return &streamInfo{close: func(error) {}}
	}
	return si
}

// ServerTLS loads the KDS certificate and key, or, when both are empty, makes a self-signed
// certificate for localhost and writes it (and its key) under dir, as kds.crt and kds.key, so
// that zones can trust it.
func ServerTLS(certFile, keyFile, dir string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("a KDS certificate and its key go together: give both or neither")
	}
	if certFile == "" {
		certFile, keyFile = filepath.Join(dir, "kds.crt"), filepath.Join(dir, "kds.key")
		if _, err := os.Stat(certFile); os.IsNotExist(err) {
			if err := writeSelfSigned(certFile, keyFile); err != nil {
				return nil, fmt.Errorf("make a self-signed KDS certificate: %w", err)
			}
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load KDS certificate %s: %w", certFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func writeSelfSigned(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kds-host global", Organization: []string{"kds-host"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(5, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(certFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

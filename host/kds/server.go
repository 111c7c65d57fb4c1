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
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/kds-host/kds-host/engine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
)

// ServerConfig is how NewGRPCServer serves. The zero value serves plaintext, unauthenticated.
type ServerConfig struct {
	// TLS serves KDS over TLS; nil serves plaintext.
	TLS *tls.Config
	// Authenticate names the zone a stream's credentials prove, or refuses the stream with a gRPC
	// status error. Nil accepts every stream as whatever zone its node id names.
	Authenticate func(ctx context.Context) (zone string, err error)
	// Header is sent to each stream before anything else (the store id, for the zone).
	Header metadata.MD
	// MaxStreamsPerConnection bounds the streams one connection may have open (default 16).
	MaxStreamsPerConnection uint32
	// Conns, when set, registers the server's connections, so that a stream the response
	// timeout closes has its connection dropped. Nil: the stream is closed only.
	Conns *engine.Conns
	// MaxRequestBytes bounds one message a client sends (default DefaultMaxRequestBytes); past
	// it the stream ends with ResourceExhausted.
	MaxRequestBytes int
	// Arrivals bounds how fast new streams are served, and ArrivalWait how long one waits for
	// its turn (engine.ADSConfig's).
	Arrivals    engine.RateLimit
	ArrivalWait time.Duration
	// Options are more gRPC server options, after the server's own (the caller's interceptors).
	Options []grpc.ServerOption
}

// ServerWindow is the KDS server's flow-control window, a stream's and a connection's.
const ServerWindow = 1 << 20

// NewGRPCServer returns a gRPC server that serves KDS (ADS, delta only) from cache through
// go-control-plane's delta server, with tracker as its callbacks, and grpc.health.v1. The server
// stops serving streams when ctx ends.
func NewGRPCServer(ctx context.Context, c *engine.Cache, t *engine.Tracker, cfg ServerConfig) (*grpc.Server, *health.Server) {
	if cfg.MaxStreamsPerConnection == 0 {
		cfg.MaxStreamsPerConnection = 16
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = engine.DefaultMaxRequestBytes
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRequestBytes),
		grpc.ForceServerCodecV2(c.Codec()),
		grpc.MaxConcurrentStreams(cfg.MaxStreamsPerConnection),
		// Fixed windows: a dynamic one has grpc-go PING after each request and ACK it receives.
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
	s := grpc.NewServer(append(opts, cfg.Options...)...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s, c.DeltaADS(ctx, t, engine.ADSConfig{Authenticate: cfg.Authenticate, Header: cfg.Header, Conns: cfg.Conns,
		Arrivals: cfg.Arrivals, ArrivalWait: cfg.ArrivalWait}))
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until the caller says so
	healthpb.RegisterHealthServer(s, h)
	return s, h
}

// ServerTLS loads the KDS certificate and key, or, when both are empty, makes a self-signed
// certificate for localhost and writes it under dir (kds.crt, kds.key), for zones to trust.
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

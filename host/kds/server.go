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
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	delta "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// NewGRPCServer returns a gRPC server that serves KDS (ADS, delta only) from cache through
// go-control-plane's delta server, with tracker as its callbacks, and grpc.health.v1. A nil
// tlsConfig serves plaintext. The server stops serving streams when ctx ends.
func NewGRPCServer(ctx context.Context, c *Cache, t *Tracker, tlsConfig *tls.Config) (*grpc.Server, *health.Server) {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(64 << 20),
		grpc.MaxConcurrentStreams(100000),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	s := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(s, &ads{delta: delta.NewServer(ctx, c, t)})
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until the caller says so
	healthpb.RegisterHealthServer(s, h)
	return s, h
}

// ads serves the delta half of the Aggregated Discovery Service.
type ads struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	delta delta.Server
}

func (a *ads) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return a.delta.DeltaStreamHandler(s, resource.AnyType)
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

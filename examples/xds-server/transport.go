package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// serverOptions are the xDS gRPC server's options from the flags: TLS (mutual with
// --tls-client-ca), the streams one connection and the whole server may have open, and the
// largest request it reads.
func serverOptions(cfg config, streams *streamLimit) ([]grpc.ServerOption, error) {
	opts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(cfg.maxStreamsPerConn),
		grpc.MaxRecvMsgSize(cfg.maxReceiveMessage),
		grpc.ChainStreamInterceptor(streams.intercept),
	}
	tc, err := serverTLS(cfg.tlsCert, cfg.tlsKey, cfg.tlsClientCA)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	return opts, nil
}

// serverTLS is the xDS listener's TLS configuration: nil without a certificate (plaintext);
// with clientCA, a client must present a certificate it signed.
func serverTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "" && clientCA == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("--tls-cert and --tls-key go together (and --tls-client-ca needs both)")
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", certFile, keyFile, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s: no PEM certificate in it", clientCA)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// streamLimit refuses a stream past max open at once (0: no bound) with RESOURCE_EXHAUSTED,
// and counts the refusals.
type streamLimit struct {
	max     int64
	open    atomic.Int64
	refused atomic.Int64
}

func (l *streamLimit) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if n := l.open.Add(1); l.max > 0 && n > l.max {
		l.open.Add(-1)
		l.refused.Add(1)
		return status.Errorf(codes.ResourceExhausted, "this xDS server has %d streams open, its bound (--max-streams)", l.max)
	}
	defer l.open.Add(-1)
	return handler(srv, ss)
}

var (
	streamsOpenDesc    = prometheus.NewDesc("kds_xds_streams_open", "xDS streams open.", nil, nil)
	streamsRefusedDesc = prometheus.NewDesc("kds_xds_streams_refused_total", "xDS streams refused past --max-streams.", nil, nil)
)

func (l *streamLimit) Describe(ch chan<- *prometheus.Desc) {
	ch <- streamsOpenDesc
	ch <- streamsRefusedDesc
}

func (l *streamLimit) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(streamsOpenDesc, prometheus.GaugeValue, float64(l.open.Load()))
	ch <- prometheus.MustNewConstMetric(streamsRefusedDesc, prometheus.CounterValue, float64(l.refused.Load()))
}

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestStreamsPastMaxStreamsAreRefused: with --max-streams 1, a second stream (on a connection
// of its own) ends with RESOURCE_EXHAUSTED and is counted; the first is served.
func TestStreamsPastMaxStreamsAreRefused(t *testing.T) {
	g := NewWithT(t)
	s := start(t, "testdata/resources.yaml", "--max-streams", "1")
	a := dial(t, s.xds)
	a.send(t, &discovery.DiscoveryRequest{})
	g.Expect(clusters(t, a.recv(t))).To(HaveKey("greeter-cluster"))

	b := dial(t, s.xds)
	b.send(t, &discovery.DiscoveryRequest{})
	var err error
	g.Eventually(b.errs, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
	g.Expect(metric(s, t)()).To(And(ContainSubstring("kds_xds_streams_refused_total 1"), ContainSubstring("kds_xds_streams_open 1")))
}

// TestTheGuardsPerStreamBoundsAreFlags: --max-names-per-stream reaches the guard, which refuses
// a request past it with RESOURCE_EXHAUSTED and counts it; a stream within it is served.
func TestTheGuardsPerStreamBoundsAreFlags(t *testing.T) {
	g := NewWithT(t)
	s := start(t, "testdata/resources.yaml", "--max-names-per-stream", "2")
	a := dial(t, s.xds)
	a.send(t, &discovery.DiscoveryRequest{ResourceNames: []string{"greeter-cluster"}})
	g.Expect(clusters(t, a.recv(t))).To(HaveKey("greeter-cluster"))

	b := dial(t, s.xds)
	b.send(t, &discovery.DiscoveryRequest{ResourceNames: []string{"a", "b", "c"}})
	var err error
	g.Eventually(b.errs, 10*time.Second).Should(Receive(&err))
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
	g.Expect(metric(s, t)()).To(MatchRegexp(`kds_xds_refusals_total\{reason="[a-z_]+"\} 1`))
}

// pki is a CA and the files of a server and a client certificate it signed.
type pki struct {
	ca                            *x509.CertPool
	caFile, serverCert, serverKey string
	client                        tls.Certificate
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	must(t, err)
	issue := func(serial int64, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(t, err)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		must(t, err)
		keyDER, err := x509.MarshalECPrivateKey(key)
		must(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	}
	p := pki{ca: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem"),
		serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem")}
	p.ca.AddCert(caCert)
	must(t, os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644))
	cert, key := issue(2, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	must(t, os.WriteFile(p.serverCert, cert, 0o644))
	must(t, os.WriteFile(p.serverKey, key, 0o600))
	cert, key = issue(3, x509.ExtKeyUsageClientAuth, nil)
	p.client, err = tls.X509KeyPair(cert, key)
	must(t, err)
	return p
}

// TestWithTLSClientCAOnlyAClientWithACertificateGetsResources: --tls-cert, --tls-key and
// --tls-client-ca serve xDS over mutual TLS; a client without a certificate, or in plaintext,
// gets nothing.
func TestWithTLSClientCAOnlyAClientWithACertificateGetsResources(t *testing.T) {
	p := newPKI(t)
	s := start(t, "testdata/resources.yaml", "--tls-cert", p.serverCert, "--tls-key", p.serverKey, "--tls-client-ca", p.caFile)
	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
		ok    bool
	}{
		{"a client certificate", credentials.NewTLS(&tls.Config{RootCAs: p.ca, Certificates: []tls.Certificate{p.client}}), true},
		{"no client certificate", credentials.NewTLS(&tls.Config{RootCAs: p.ca}), false},
		{"plaintext", insecure.NewCredentials(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			conn, err := grpc.NewClient(s.xds, grpc.WithTransportCredentials(c.creds))
			must(t, err)
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := fetchClusters(ctx, conn)
			if !c.ok {
				g.Expect(err).To(HaveOccurred())
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(clusters(t, r)).To(HaveKey("greeter-cluster"))
		})
	}
	g := NewWithT(t)
	g.Expect(s.logs.String()).To(ContainSubstring("tls=mutual"))
}

// fetchClusters asks for every Cluster on an ADS stream and returns the first response.
func fetchClusters(ctx context.Context, conn *grpc.ClientConn) (*discovery.DiscoveryResponse, error) {
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&discovery.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}); err != nil {
		return nil, err
	}
	return st.Recv()
}

// TestFlagsThatCannotWorkAreErrors: the TLS flags go together, and the bounds are positive.
func TestFlagsThatCannotWorkAreErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-key", "k.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-client-ca", "ca.pem"}, "--tls-client-ca needs both"},
		{[]string{"--tls-cert", "/no/such.pem", "--tls-key", "/no/such-key.pem"}, "--tls-cert /no/such.pem"},
		{[]string{"--max-resources-bytes", "0"}, "--max-resources-bytes 0"},
		{[]string{"--max-streams-per-connection", "0"}, "--max-streams-per-connection 0"},
		{[]string{"--resources-settle", "-1s"}, "--resources-settle -1s"},
	} {
		t.Run(c.want, func(t *testing.T) {
			g := NewWithT(t)
			args := append([]string{"--resources", "testdata/resources.yaml", "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, c.args...)
			err := runWith(context.Background(), args, nil, hooks{logOut: &syncBuffer{}})
			g.Expect(err).To(MatchError(ContainSubstring(c.want)))
		})
	}
}

package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// ProtocolDoc is the document that specifies the plugin protocol; messages name its sections.
const ProtocolDoc = "docs/plugin-protocol.md"

// DocSection names a section of ProtocolDoc for a message: "see docs/plugin-protocol.md#anchor".
func DocSection(anchor string) string {
	return fmt.Sprintf("see %s#%s", ProtocolDoc, anchor)
}

// ErrNoAutoMTLS is the error (wrapped) for a plugin that completed the handshake but that the
// host cannot talk to over AutoMTLS: most often one that serves plaintext gRPC.
var ErrNoAutoMTLS = errors.New("no AutoMTLS")

// Unreachable explains why the host could not talk to the plugin, given the error of the first
// call it made after the handshake (a health check, a Describe): an error that wraps
// ErrNoAutoMTLS, names AutoMTLS and says what to implement and where it is specified. When the
// plugin answers plaintext gRPC on its address, the message says so. It returns nil when err
// is not a failure to talk (a call the plugin answered with an error, a deadline). The host's
// runtime and the conformance suite both explain a plugin without AutoMTLS with it.
func (p *Process) Unreachable(ctx context.Context, err error, timeout time.Duration) error {
	if err == nil || status.Code(err) != codes.Unavailable {
		return nil
	}
	cause := err.Error()
	if _, tlsErr, ok := strings.Cut(cause, "authentication handshake failed: "); ok {
		cause = strings.Trim(tlsErr, `"`)
	}
	addr := "its address"
	if rc := p.client.ReattachConfig(); rc != nil && rc.Addr != nil {
		addr = rc.Addr.Network() + " " + rc.Addr.String()
		if plaintextAnswers(ctx, rc.Addr, timeout) {
			return fmt.Errorf("%w: the plugin serves plaintext gRPC on %s, and kds-host always uses AutoMTLS, so the host cannot talk to it (%s). "+
				"Implement AutoMTLS: read the host's certificate (PEM) from PLUGIN_CLIENT_CERT, serve TLS with a self-signed certificate for localhost "+
				"that requires the host's certificate as the client's, and send that certificate's DER, base64 without padding, as the sixth field of "+
				"the handshake line (%s; shared.Serve* does it for Go)", ErrNoAutoMTLS, addr, cause, DocSection("automtls"))
		}
	}
	if !strings.Contains(err.Error(), "authentication handshake failed") {
		return nil // not TLS: the plugin went away, say
	}
	return fmt.Errorf("%w: the host cannot talk to the plugin over AutoMTLS on %s: %s. kds-host always uses AutoMTLS: the plugin's certificate (the sixth field of the handshake line) "+
		"must be valid for localhost, and the plugin must require the host's certificate from PLUGIN_CLIENT_CERT (%s)",
		ErrNoAutoMTLS, addr, cause, DocSection("automtls"))
}

// plaintextAnswers reports whether a plaintext gRPC health check gets an answer at addr: a
// plugin that did not do AutoMTLS.
func plaintextAnswers(ctx context.Context, addr net.Addr, timeout time.Duration) bool {
	conn, err := grpc.NewClient("passthrough:///plugin",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, addr.Network(), addr.String())
		}))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
	st := status.Code(err)
	return err == nil || (st != codes.Unavailable && st != codes.DeadlineExceeded && st != codes.Canceled)
}

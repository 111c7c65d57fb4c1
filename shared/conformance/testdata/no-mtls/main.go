// Command no-mtls is a broken RetryForcer fixture: a plugin written by hand that answers
// go-plugin's handshake and serves gRPC, but in plaintext. It ignores PLUGIN_CLIENT_CERT and
// sends no certificate in its handshake line, as a first Node.js or Python plugin does; kds-host
// always asks for AutoMTLS and cannot talk to it.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance/testdata/fixture"
)

// server serves a correct policy over gRPC.
type server struct {
	pluginv1.UnimplementedRetryForcerServer
	f *fixture.Forcer
}

func (s server) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	return s.f.Describe(ctx)
}

func (s server) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return s.f.Configure(ctx, req)
}

func (s server) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return s.f.Schedule(ctx, req)
}

func main() {
	if os.Getenv(shared.Handshake.MagicCookieKey) != shared.Handshake.MagicCookieValue {
		fmt.Fprintln(os.Stderr, "This binary is a plugin.")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "no-mtls-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "plugin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	s := grpc.NewServer()
	pluginv1.RegisterRetryForcerServer(s, server{f: fixture.New("no-mtls")})
	h := health.NewServer()
	h.SetServingStatus("plugin", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	// Five fields: no certificate, so no AutoMTLS.
	fmt.Printf("1|1|unix|%s|grpc\n", sock)
	_ = s.Serve(ln)
}

// Command v1plugin is a RetryForcer built from the plugin.v1 contract as it stood before
// rejection causes (the generated code beside it), served through go-plugin without the shared
// package: a fixed delay each round, a give-up after maxAttempts rounds (0: never). Its policy
// document: "delay: 50ms\nmaxAttempts: 0".
package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	pluginv1 "github.com/kds-host/kds-host/shared/conformance/testdata/v1plugin/pluginv1"
)

type policy struct {
	Delay       string `json:"delay"`
	MaxAttempts uint32 `json:"maxAttempts"`
	delay       time.Duration
}

type fixed struct {
	pluginv1.UnimplementedRetryForcerServer
	p atomic.Pointer[policy]
}

func (f *fixed) Describe(context.Context, *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	d := durationpb.New(f.p.Load().delay)
	return &pluginv1.DescribeResponse{Name: "v1plugin", Version: "1.0.0", Capabilities: []string{"max-attempts"},
		MaxDelay: d, MinDelay: d, SampleConfig: "delay: 50ms\nmaxAttempts: 0\n"}, nil
}

func (f *fixed) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	p := &policy{}
	if err := yaml.UnmarshalStrict(req.GetDocument(), p); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "document: %v", err)
	}
	d, err := time.ParseDuration(p.Delay)
	if err != nil || d <= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "delay: want a positive duration such as 50ms, got %q", p.Delay)
	}
	p.delay = d
	f.p.Store(p)
	return &pluginv1.ConfigureResponse{Policy: "fixed " + d.String()}, nil
}

func (f *fixed) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	p := f.p.Load()
	if p.MaxAttempts > 0 && req.GetRound() >= p.MaxAttempts {
		return &pluginv1.ScheduleResponse{GiveUp: true, Reason: fmt.Sprintf("max attempts %d reached", p.MaxAttempts)}, nil
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(p.delay)}, nil
}

// grpcPlugin registers the server under go-plugin; the host holds the client side.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl *fixed
}

func (g *grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterRetryForcerServer(s, g.impl)
	return nil
}

func (g *grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, fmt.Errorf("v1plugin serves only")
}

func main() {
	f := &fixed{}
	f.p.Store(&policy{Delay: "50ms", delay: 50 * time.Millisecond})
	plugin.Serve(&plugin.ServeConfig{
		// kds-host's handshake as it stood: protocol 1, its cookie.
		HandshakeConfig:  plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "KDS_HOST_PLUGIN", MagicCookieValue: "6f1d8c0e-kds-host-plugin-protocol"},
		VersionedPlugins: map[int]plugin.PluginSet{1: {"retry_forcer": &grpcPlugin{impl: f}}},
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           hclog.New(&hclog.LoggerOptions{Level: hclog.Info, JSONFormat: true, Output: os.Stderr}),
	})
}

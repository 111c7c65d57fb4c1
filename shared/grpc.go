package shared

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// RetryForcerPlugin is the go-plugin glue for RetryForcer: Impl is set on the plugin side.
type RetryForcerPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl RetryForcer
}

func (p *RetryForcerPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterRetryForcerServer(s, &retryForcerServer{impl: p.Impl})
	return nil
}

func (p *RetryForcerPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewRetryForcerClient(c), nil
}

// OwnerCheckPlugin is the go-plugin glue for OwnerCheck: Impl is set on the plugin side.
type OwnerCheckPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl OwnerCheck
}

func (p *OwnerCheckPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterOwnerCheckServer(s, &ownerCheckServer{impl: p.Impl})
	return nil
}

func (p *OwnerCheckPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewOwnerCheckClient(c), nil
}

// recovered turns a panic in an implementation into an Internal error, so one bad call never
// takes the plugin process (and every call in flight) down with it.
func recovered(op string, err *error) {
	if r := recover(); r != nil {
		*err = status.Errorf(codes.Internal, "%s panicked: %v", op, r)
	}
}

// retryForcerServer serves a RetryForcer implementation over gRPC.
type retryForcerServer struct {
	pluginv1.UnimplementedRetryForcerServer
	impl RetryForcer
}

func (s *retryForcerServer) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (resp *pluginv1.DescribeResponse, err error) {
	defer recovered("Describe", &err)
	resp, err = s.impl.Describe(ctx)
	return resp, toStatus(err)
}

func (s *retryForcerServer) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (resp *pluginv1.ConfigureResponse, err error) {
	defer recovered("Configure", &err)
	resp, err = s.impl.Configure(ctx, req)
	return resp, toStatus(err)
}

func (s *retryForcerServer) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (resp *pluginv1.ScheduleResponse, err error) {
	defer recovered("Schedule", &err)
	resp, err = s.impl.Schedule(ctx, req)
	return resp, toStatus(err)
}

// ownerCheckServer serves an OwnerCheck implementation over gRPC.
type ownerCheckServer struct {
	pluginv1.UnimplementedOwnerCheckServer
	impl OwnerCheck
}

func (s *ownerCheckServer) Describe(ctx context.Context, _ *pluginv1.DescribeRequest) (resp *pluginv1.DescribeResponse, err error) {
	defer recovered("Describe", &err)
	resp, err = s.impl.Describe(ctx)
	return resp, toStatus(err)
}

func (s *ownerCheckServer) Predict(ctx context.Context, req *pluginv1.PredictRequest) (resp *pluginv1.PredictResponse, err error) {
	defer recovered("Predict", &err)
	resp, err = s.impl.Predict(ctx, req)
	if err == nil && len(resp.GetPredictions()) != len(req.GetCandidates()) {
		err = status.Errorf(codes.Internal, "Predict returned %d predictions for %d candidates",
			len(resp.GetPredictions()), len(req.GetCandidates()))
	}
	return resp, toStatus(err)
}

// RetryForcerClient is a RetryForcer backed by a gRPC connection to a plugin.
type RetryForcerClient struct{ c pluginv1.RetryForcerClient }

// NewRetryForcerClient returns a RetryForcer that calls the plugin behind conn.
func NewRetryForcerClient(conn grpc.ClientConnInterface) *RetryForcerClient {
	return &RetryForcerClient{c: pluginv1.NewRetryForcerClient(conn)}
}

func (c *RetryForcerClient) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	resp, err := c.c.Describe(ctx, &pluginv1.DescribeRequest{})
	return resp, fromStatus("RetryForcer.Describe", err)
}

func (c *RetryForcerClient) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	resp, err := c.c.Configure(ctx, req)
	return resp, fromStatus("RetryForcer.Configure", err)
}

func (c *RetryForcerClient) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	resp, err := c.c.Schedule(ctx, req)
	return resp, fromStatus("RetryForcer.Schedule", err)
}

// OwnerCheckClient is an OwnerCheck backed by a gRPC connection to a plugin.
type OwnerCheckClient struct{ c pluginv1.OwnerCheckClient }

// NewOwnerCheckClient returns an OwnerCheck that calls the plugin behind conn.
func NewOwnerCheckClient(conn grpc.ClientConnInterface) *OwnerCheckClient {
	return &OwnerCheckClient{c: pluginv1.NewOwnerCheckClient(conn)}
}

func (c *OwnerCheckClient) Describe(ctx context.Context) (*pluginv1.DescribeResponse, error) {
	resp, err := c.c.Describe(ctx, &pluginv1.DescribeRequest{})
	return resp, fromStatus("OwnerCheck.Describe", err)
}

func (c *OwnerCheckClient) Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	resp, err := c.c.Predict(ctx, req)
	if err == nil && len(resp.GetPredictions()) != len(req.GetCandidates()) {
		return nil, fmt.Errorf("plugin OwnerCheck.Predict: %d predictions for %d candidates",
			len(resp.GetPredictions()), len(req.GetCandidates()))
	}
	return resp, fromStatus("OwnerCheck.Predict", err)
}

var (
	_ RetryForcer = (*RetryForcerClient)(nil)
	_ OwnerCheck  = (*OwnerCheckClient)(nil)
)

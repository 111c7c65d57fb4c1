package shared

import (
	"context"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// RetryForcer decides when a zone stream's rejected resources are sent again. It is policy, not
// state: every call carries what the decision needs. Implementations must be safe for concurrent
// use and must answer bad input with an InvalidArgument error (see InvalidArgument).
type RetryForcer interface {
	Describe(ctx context.Context) (*pluginv1.DescribeResponse, error)
	// Configure replaces the policy document; on error the previous policy stays in force.
	Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error)
	Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error)
}

// OwnerCheck predicts which resources a zone would reject because their owner is missing there.
// Predict returns exactly one prediction per candidate, in order.
type OwnerCheck interface {
	Describe(ctx context.Context) (*pluginv1.DescribeResponse, error)
	Predict(ctx context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error)
}

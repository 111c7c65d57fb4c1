// Command failing-owner-check is a broken build of the reference owner check for the real
// Prometheus test: it describes itself as owner-check does, and every Predict fails (its
// inventory cannot be read), so the host fails open on every push it asks about.
package main

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

type failing struct{ *ownerpredict.Predictor }

func (failing) Predict(context.Context, *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	return nil, status.Error(codes.Unavailable, "the inventory cannot be read")
}

func main() { shared.ServeOwnerCheck(failing{ownerpredict.New()}) }

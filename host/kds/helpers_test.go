package kds_test

import (
	"testing"

	"go.uber.org/goleak"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
)

func statusMessage(msg string) *rpcstatus.Status { return &rpcstatus.Status{Code: 3, Message: msg} }

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

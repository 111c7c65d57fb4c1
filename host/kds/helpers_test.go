package kds_test

import (
	"testing"

	"go.uber.org/goleak"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/host/kds"
)

type recorder struct {
	nack func(kds.NACK)
}

func (r *recorder) StreamOpened(int64, string)                              {}
func (r *recorder) Sent(int64, string, string, map[string]string, []string) {}
func (r *recorder) Acked(kds.ACK)                                           {}
func (r *recorder) Nacked(n kds.NACK)                                       { r.nack(n) }
func (r *recorder) StreamClosed(int64, string)                              {}

func statusMessage(msg string) *rpcstatus.Status { return &rpcstatus.Status{Code: 3, Message: msg} }

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

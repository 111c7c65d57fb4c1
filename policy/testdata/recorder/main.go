// Command recorder is a RetryForcer fixture that writes down what it is asked: one JSON line per
// Schedule call in the file $RECORD_FILE (the host passes it with --plugin-env RECORD_FILE), with
// each failing kind's error_detail as it arrived. A fixed 100ms delay every round.
package main

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Call is one line of the record.
type Call struct {
	Zone    string `json:"zone"`
	Round   uint32 `json:"round"`
	Failing []Kind `json:"failing"`
}

// Kind is one failing kind of a call.
type Kind struct {
	Kind        string   `json:"kind"`
	Names       []string `json:"names"`
	ErrorDetail string   `json:"errorDetail"`
}

type recorder struct {
	mu   sync.Mutex
	file string
}

func (r *recorder) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "recorder", Version: "0.0.1", MaxDelay: durationpb.New(100 * time.Millisecond), SampleConfig: "{}"}, nil
}

func (r *recorder) Configure(context.Context, *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{Policy: "fixed 100ms"}, nil
}

func (r *recorder) Schedule(_ context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	c := Call{Zone: req.GetZone(), Round: req.GetRound()}
	for _, f := range req.GetFailing() {
		c.Failing = append(c.Failing, Kind{Kind: f.GetKind(), Names: f.GetRejectedNames(), ErrorDetail: f.GetErrorDetail()})
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.OpenFile(r.file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(100 * time.Millisecond), Reason: "recorded"}, nil
}

func main() { shared.ServeRetryForcer(&recorder{file: os.Getenv("RECORD_FILE")}) }

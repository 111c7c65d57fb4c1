// Command env is a test fixture: a RetryForcer plugin that reports the environment it was
// started with. When ENV_REPORT_FILE is set (the host must allow it), it writes its whole
// environment there, as a JSON list of NAME=VALUE, before it answers the handshake. Describe
// names it "env".
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

type forcer struct{}

func (forcer) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "env", Version: "0.0.1", MaxDelay: durationpb.New(time.Second)}, nil
}

func (forcer) Configure(context.Context, *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{Policy: "fixed 1s"}, nil
}

func (forcer) Schedule(context.Context, *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second)}, nil
}

// report writes the environment to file, whole or not at all.
func report(file string) error {
	b, err := json.Marshal(os.Environ())
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

func main() {
	if file := os.Getenv("ENV_REPORT_FILE"); file != "" {
		if err := report(file); err != nil {
			fmt.Fprintln(os.Stderr, "env: report the environment:", err)
			os.Exit(1)
		}
	}
	shared.ServeRetryForcer(forcer{})
}

package policy_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/policy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// BenchmarkScheduleThroughTheRuntime measures one Schedule call as the retry scheduler makes it:
// through Runtime.RetryForcer (generation lookup, call deadline, counting) to the retry-forcer
// binary over go-plugin's gRPC connection with AutoMTLS, and reports p50 and p99. The builtin
// case is the same path answered in-process, for comparison.
func BenchmarkScheduleThroughTheRuntime(b *testing.B) {
	for _, bc := range []struct {
		name string
		spec func(testing.TB) policy.Spec
	}{
		{"plugin", func(t testing.TB) policy.Spec { return policy.Spec{Path: retryForcerBin(t)} }},
		{"builtin", func(testing.TB) policy.Spec { return policy.Spec{Path: policy.Builtin} }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := config(bc.spec(b))
			cfg.ProbeInterval = time.Hour
			rt := start(b, cfg)
			rf := rt.RetryForcer()
			req := &pluginv1.ScheduleRequest{Zone: "zone-1", Round: 2, LastDelay: durationpb.New(200 * time.Millisecond),
				Failing: []*pluginv1.FailingKind{{Kind: "Mesh", RejectedNames: []string{"default"}},
					{Kind: "MeshTimeout", RejectedNames: []string{"default/a", "default/b"}}}}
			ctx := context.Background()
			lat := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond) // as the scheduler does
				_, err := rf.Schedule(ctx, req)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		})
	}
}

// Package plugins_test runs the reference plugin binaries as real go-plugin subprocesses.
package plugins_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/internal/testbin"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// start launches a plugin binary through a go-plugin client and dispenses name.
func start(t testing.TB, path, name string) (*plugin.Client, any) {
	t.Helper()
	cfg := shared.ClientConfig(exec.Command(path), hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Warn}))
	cfg.StartTimeout = 10 * time.Second
	client := plugin.NewClient(cfg)
	t.Cleanup(client.Kill)
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	impl, err := rpc.Dispense(name)
	if err != nil {
		t.Fatalf("dispense %s: %v", name, err)
	}
	return client, impl
}

// gone reports whether no process has pid (a zombie is reaped by go-plugin's Wait).
func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestRetryForcerSubprocessRoundTrip(t *testing.T) {
	g := NewWithT(t)
	client, impl := start(t, testbin.Build(t, "./plugins/retry-forcer"), shared.RetryForcerName)
	rf := impl.(shared.RetryForcer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	d, err := rf.Describe(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.GetName()).To(Equal("retry-forcer"))
	g.Expect(d.GetMaxDelay().AsDuration()).To(Equal(30 * time.Second))

	_, err = rf.Configure(ctx, &pluginv1.ConfigureRequest{Document: []byte("policy: fixed\ndelay: 2s\n")})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = rf.Configure(ctx, &pluginv1.ConfigureRequest{Document: []byte("policy: fixed\nfactor: 0.5\n")})
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(err.Error()).To(ContainSubstring("factor"))

	s, err := rf.Schedule(ctx, &pluginv1.ScheduleRequest{Zone: "zone-1", Round: 3,
		Failing: []*pluginv1.FailingKind{{Kind: "Mesh", RejectedNames: []string{"default"}}}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.GetDelay().AsDuration()).To(Equal(2*time.Second), "the fixed policy configured above is in force")
	g.Expect(s.GetKinds()).To(Equal([]string{"Mesh"}))

	pid := client.ReattachConfig().Pid
	g.Expect(gone(pid)).To(BeFalse())
	client.Kill()
	g.Eventually(func() bool { return gone(pid) }).Should(BeTrue(), "plugin process %d left behind", pid)
}

func TestOwnerCheckSubprocessRoundTrip(t *testing.T) {
	g := NewWithT(t)
	client, impl := start(t, testbin.Build(t, "./plugins/owner-check"), shared.OwnerCheckName)
	oc := impl.(shared.OwnerCheck)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	d, err := oc.Describe(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.GetName()).To(Equal("owner-check"))

	resp, err := oc.Predict(ctx, &pluginv1.PredictRequest{Zone: "zone-1",
		Candidates: []*kdsv1.Resource{
			{Kind: "Mesh", Name: "default"},
			{Kind: "MeshTimeout", Mesh: "default", Name: "t"},
			{Kind: "MeshTimeout", Mesh: "other", Name: "t"},
		}})
	g.Expect(err).NotTo(HaveOccurred())
	var verdicts []pluginv1.Verdict
	for _, p := range resp.GetPredictions() {
		verdicts = append(verdicts, p.GetVerdict())
	}
	g.Expect(verdicts).To(Equal([]pluginv1.Verdict{pluginv1.Verdict_VERDICT_ACCEPT, pluginv1.Verdict_VERDICT_WAIT, pluginv1.Verdict_VERDICT_REJECT}))

	pid := client.ReattachConfig().Pid
	client.Kill()
	g.Eventually(func() bool { return gone(pid) }).Should(BeTrue(), "plugin process %d left behind", pid)
}

func TestRunningAPluginByHandExplainsAndFails(t *testing.T) {
	for _, pkg := range []string{"./plugins/retry-forcer", "./plugins/owner-check"} {
		t.Run(pkg, func(t *testing.T) {
			g := NewWithT(t)
			cmd := exec.Command(testbin.Build(t, pkg))
			cmd.Env = []string{} // no magic cookie
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			g.Expect(errors.As(err, &exit)).To(BeTrue(), "want a non-zero exit, got %v", err)
			g.Expect(exit.ExitCode()).NotTo(BeZero())
			g.Expect(string(out)).To(ContainSubstring("This binary is a plugin"))
		})
	}
}

// BenchmarkScheduleSubprocess measures one Schedule call to the retry-forcer binary over
// go-plugin's gRPC connection (AutoMTLS on), and reports p50 and p99.
func BenchmarkScheduleSubprocess(b *testing.B) {
	_, impl := start(b, testbin.Build(b, "./plugins/retry-forcer"), shared.RetryForcerName)
	rf := impl.(shared.RetryForcer)
	req := &pluginv1.ScheduleRequest{Zone: "zone-1", Round: 2, LastDelay: durationpb.New(200 * time.Millisecond),
		Failing: []*pluginv1.FailingKind{{Kind: "Mesh", RejectedNames: []string{"default"}}, {Kind: "MeshTimeout", RejectedNames: []string{"default/a", "default/b"}}}}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := rf.Schedule(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPredict10kSubprocess measures one batched Predict call with 10,000 candidates (and a
// 10,000-key inventory) to the owner-check binary over go-plugin's gRPC connection.
func BenchmarkPredict10kSubprocess(b *testing.B) {
	_, impl := start(b, testbin.Build(b, "./plugins/owner-check"), shared.OwnerCheckName)
	oc := impl.(shared.OwnerCheck)
	req := &pluginv1.PredictRequest{Zone: "zone-1"}
	for i := range 10000 {
		mesh := fmt.Sprintf("mesh-%d", i%100)
		req.Candidates = append(req.Candidates, &kdsv1.Resource{Kind: "MeshTimeout", Mesh: mesh, Name: fmt.Sprintf("t-%d", i)})
		req.Inventory = append(req.Inventory, &kdsv1.ResourceKey{Kind: "MeshRetry", Mesh: mesh, Name: fmt.Sprintf("r-%d", i)})
	}
	for i := range 50 {
		req.Inventory = append(req.Inventory, &kdsv1.ResourceKey{Kind: "Mesh", Name: fmt.Sprintf("mesh-%d", i)})
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		resp, err := oc.Predict(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if len(resp.GetPredictions()) != 10000 {
			b.Fatalf("%d predictions", len(resp.GetPredictions()))
		}
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

package shared_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// fakeForcer is a RetryForcer test double: fixed answers, and errors on demand.
type fakeForcer struct{}

func (fakeForcer) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "fake", Version: "1", MaxDelay: durationpb.New(time.Second)}, nil
}

func (fakeForcer) Configure(_ context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	if string(req.GetDocument()) == "bad" {
		return nil, shared.InvalidArgument("policy", "unknown policy %q", "bad")
	}
	return &pluginv1.ConfigureResponse{Policy: "fixed"}, nil
}

func (fakeForcer) Schedule(ctx context.Context, req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	switch req.GetZone() {
	case "panic":
		panic("boom")
	case "slow":
		<-ctx.Done()
		return nil, ctx.Err()
	case "plain-error":
		return nil, errors.New("database on fire")
	}
	return &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Duration(req.GetRound()+1) * time.Millisecond)}, nil
}

type fakeOwner struct{ short bool }

func (fakeOwner) Describe(context.Context) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{Name: "owner"}, nil
}

func (f fakeOwner) Predict(_ context.Context, req *pluginv1.PredictRequest) (*pluginv1.PredictResponse, error) {
	resp := &pluginv1.PredictResponse{}
	for _, c := range req.GetCandidates() {
		resp.Predictions = append(resp.Predictions, &pluginv1.Prediction{Key: &kdsv1.ResourceKey{Kind: c.GetKind(), Name: c.GetName()}, Verdict: pluginv1.Verdict_VERDICT_ACCEPT})
	}
	if f.short && len(resp.Predictions) > 0 {
		resp.Predictions = resp.Predictions[1:]
	}
	return resp, nil
}

// dispense starts an in-process go-plugin gRPC connection and returns both plugin clients.
func dispense(t *testing.T, oc shared.OwnerCheck) (shared.RetryForcer, shared.OwnerCheck) {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, shared.PluginSets(fakeForcer{}, oc)[shared.ProtocolVersion])
	// Stop the server first: client.Close asks the server to stop itself too, and two Stops at
	// once race inside go-plugin's GRPCServer.
	t.Cleanup(func() { server.Stop(); client.Close() })
	rf, err := client.Dispense(shared.RetryForcerName)
	if err != nil {
		t.Fatal(err)
	}
	o, err := client.Dispense(shared.OwnerCheckName)
	if err != nil {
		t.Fatal(err)
	}
	return rf.(shared.RetryForcer), o.(shared.OwnerCheck)
}

func TestInProcessRoundTrip(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	rf, oc := dispense(t, fakeOwner{})

	d, err := rf.Describe(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.GetName()).To(Equal("fake"))

	c, err := rf.Configure(ctx, &pluginv1.ConfigureRequest{Document: []byte("policy: fixed")})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.GetPolicy()).To(Equal("fixed"))

	s, err := rf.Schedule(ctx, &pluginv1.ScheduleRequest{Zone: "z", Round: 2})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.GetDelay().AsDuration()).To(Equal(3 * time.Millisecond))

	p, err := oc.Predict(ctx, &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{{Kind: "Mesh", Name: "default"}}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.GetPredictions()).To(HaveLen(1))
}

func TestErrorsCrossTheBoundaryAsStatusCodes(t *testing.T) {
	ctx := context.Background()
	rf, _ := dispense(t, fakeOwner{})
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		is   error
		msg  string
	}{
		{"InvalidArgument keeps code and field", func() error {
			_, err := rf.Configure(ctx, &pluginv1.ConfigureRequest{Document: []byte("bad")})
			return err
		}, codes.InvalidArgument, nil, `policy: unknown policy "bad"`},
		{"a panic is Internal, and the plugin lives on", func() error {
			_, err := rf.Schedule(ctx, &pluginv1.ScheduleRequest{Zone: "panic"})
			return err
		}, codes.Internal, nil, "Schedule panicked: boom"},
		{"a plain Go error is Internal", func() error {
			_, err := rf.Schedule(ctx, &pluginv1.ScheduleRequest{Zone: "plain-error"})
			return err
		}, codes.Internal, nil, "database on fire"},
		{"a deadline is DeadlineExceeded and matches context.DeadlineExceeded", func() error {
			c, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			_, err := rf.Schedule(c, &pluginv1.ScheduleRequest{Zone: "slow"})
			return err
		}, codes.DeadlineExceeded, context.DeadlineExceeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.call()
			g.Expect(err).To(HaveOccurred())
			g.Expect(status.Code(err)).To(Equal(tc.code))
			if tc.is != nil {
				g.Expect(errors.Is(err, tc.is)).To(BeTrue())
			}
			g.Expect(err.Error()).To(ContainSubstring(tc.msg))
		})
	}
	// After all that, the plugin still answers.
	_, err := rf.Describe(ctx)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
}

func TestPredictMustAnswerEveryCandidate(t *testing.T) {
	g := NewWithT(t)
	_, oc := dispense(t, fakeOwner{short: true})
	_, err := oc.Predict(context.Background(), &pluginv1.PredictRequest{Candidates: []*kdsv1.Resource{{Kind: "Mesh", Name: "a"}, {Kind: "Mesh", Name: "b"}}})
	g.Expect(err).To(HaveOccurred())
	g.Expect(status.Code(err)).To(Equal(codes.Internal))
	g.Expect(err.Error()).To(ContainSubstring("1 predictions for 2 candidates"))
}

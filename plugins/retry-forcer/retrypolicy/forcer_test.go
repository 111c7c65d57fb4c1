package retrypolicy_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

func failing(kinds ...string) []*pluginv1.FailingKind {
	out := make([]*pluginv1.FailingKind, len(kinds))
	for i, k := range kinds {
		out[i] = &pluginv1.FailingKind{Kind: k, RejectedNames: []string{"a", "b"}, NackCount: 1}
	}
	return out
}

func configure(t *testing.T, f *retrypolicy.Forcer, doc string) {
	t.Helper()
	_, err := f.Configure(t.Context(), &pluginv1.ConfigureRequest{Document: []byte(doc)})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
}

func TestForcerDescribe(t *testing.T) {
	g := NewWithT(t)
	f := retrypolicy.New()
	d, err := f.Describe(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.GetName()).To(Equal("retry-forcer"))
	g.Expect(d.GetVersion()).To(Equal(retrypolicy.Version))
	g.Expect(d.GetCapabilities()).To(ConsistOf("exponential", "fixed", "decorrelated", "max-attempts", "causes"))
	g.Expect(d.GetMaxDelay().AsDuration()).To(Equal(30 * time.Second))
	g.Expect(d.GetSampleConfig()).To(Equal(retrypolicy.DefaultSampleConfig))

	cfg, err := retrypolicy.Parse([]byte(d.GetSampleConfig()))
	g.Expect(err).NotTo(HaveOccurred(), "the sample config is valid")
	g.Expect(cfg.Policy).To(Equal(retrypolicy.Exponential))

	configure(t, f, "policy: fixed\ndelay: 3s\n")
	d, err = f.Describe(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.GetMaxDelay().AsDuration()).To(Equal(3*time.Second), "max_delay follows the policy in force")
}

func TestForcerConfigure(t *testing.T) {
	g := NewWithT(t)
	f := retrypolicy.New()
	g.Expect(f.Config()).To(Equal(retrypolicy.Default()))

	resp, err := f.Configure(t.Context(), &pluginv1.ConfigureRequest{Document: []byte("policy: fixed\ndelay: 2s\nmaxAttempts: 4\n")})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetPolicy()).To(Equal("fixed delay=2s maxAttempts=4"))
	g.Expect(f.Config()).To(Equal(retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: 2 * time.Second, MaxAttempts: 4}))

	resp, err = f.Configure(t.Context(), &pluginv1.ConfigureRequest{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetPolicy()).To(Equal("exponential base=100ms factor=2 max=30s min=1ms jitter=full"), "an empty document restores the default")
	g.Expect(f.Config()).To(Equal(retrypolicy.Default()))
}

func TestForcerConfigureKeepsThePolicyOnError(t *testing.T) {
	cases := []struct {
		name, doc, msg string
	}{
		{"bad factor", "factor: 0.5\n", "factor: must be >= 1, got 0.5"},
		{"unknown policy", "policy: foo\n", `policy: unknown policy "foo" (exponential, fixed, decorrelated)`},
		{"bad duration", "policy: decorrelated\nbase: abc\n", `base: "abc" is not a duration`},
		{"field of another policy", "policy: fixed\nfactor: 2\n", "factor: does not apply to policy fixed"},
		{"unknown field", "policy: fixed\nretries: 3\n", "retries: unknown field"},
		{"not YAML", "policy: [\n", "document: not valid YAML or JSON"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			f := retrypolicy.New()
			configure(t, f, "policy: fixed\ndelay: 2s\n")
			before := f.Policy()

			_, err := f.Configure(t.Context(), &pluginv1.ConfigureRequest{Document: []byte(tc.doc)})
			g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
			g.Expect(status.Convert(err).Message()).To(ContainSubstring(tc.msg))

			g.Expect(f.Policy()).To(BeIdenticalTo(before), "the previous policy stays in force")
			g.Expect(f.Config()).To(Equal(retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: 2 * time.Second}))
			resp, err := f.Schedule(t.Context(), &pluginv1.ScheduleRequest{Failing: failing("Mesh")})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.GetDelay().AsDuration()).To(Equal(2 * time.Second))
		})
	}
}

func TestForcerApply(t *testing.T) {
	g := NewWithT(t)
	f := retrypolicy.New()
	g.Expect(f.Apply(retrypolicy.Config{Policy: retrypolicy.Fixed})).To(MatchError("delay: must be > 0, got 0s"))
	g.Expect(f.Config()).To(Equal(retrypolicy.Default()))
	g.Expect(f.Apply(decorrelatedCfg())).To(Succeed())
	g.Expect(f.Policy().Name()).To(Equal(retrypolicy.Decorrelated))
}

func TestForcerScheduleRejectsBadInput(t *testing.T) {
	cases := []struct {
		name string
		req  *pluginv1.ScheduleRequest
		msg  string
	}{
		{"nil request", nil, "failing: must list at least one failing kind"},
		{"no failing kinds", &pluginv1.ScheduleRequest{StreamId: "s", Zone: "z"}, "failing: must list at least one failing kind"},
		{"empty failing list", &pluginv1.ScheduleRequest{Failing: []*pluginv1.FailingKind{}}, "failing: must list"},
		{"nil failing kind", &pluginv1.ScheduleRequest{Failing: []*pluginv1.FailingKind{{Kind: "Mesh"}, nil}}, "failing[1]: must be set"},
		{"empty kind", &pluginv1.ScheduleRequest{Failing: failing("Mesh", "MeshTimeout", "")}, "failing[2].kind: must not be empty"},
		{"negative last delay", &pluginv1.ScheduleRequest{Failing: failing("Mesh"), LastDelay: durationpb.New(-time.Second)},
			"last_delay: must not be negative, got -1s"},
		{"malformed last delay", &pluginv1.ScheduleRequest{Failing: failing("Mesh"), LastDelay: &durationpb.Duration{Seconds: 1, Nanos: -5}},
			"last_delay: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			resp, err := retrypolicy.New().Schedule(t.Context(), tc.req)
			g.Expect(resp).To(BeNil())
			g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
			g.Expect(status.Convert(err).Message()).To(HavePrefix(tc.msg))
		})
	}
}

func TestForcerSchedule(t *testing.T) {
	cases := []struct {
		name     string
		doc      string
		round    uint32
		last     time.Duration
		delay    time.Duration // exact, when the policy has no jitter
		lo, hi   time.Duration // bounds otherwise
		giveUp   bool
		reason   string
		wantKind []string
	}{
		{name: "first round", round: 0, lo: ms, hi: 100 * ms, reason: "exponential round 0"},
		{name: "round 3", round: 3, lo: ms, hi: 800 * ms, reason: "exponential round 3"},
		{name: "round 10,000", round: 10_000, lo: ms, hi: 30 * time.Second, reason: "exponential round 10000"},
		{name: "no jitter", doc: "jitter: none", round: 2, delay: 400 * ms, reason: "exponential round 2"},
		{name: "fixed", doc: "policy: fixed\ndelay: 5s", round: 7, delay: 5 * time.Second, reason: "fixed round 7"},
		{name: "decorrelated", doc: "policy: decorrelated", round: 4, last: time.Second, lo: 100 * ms, hi: 3 * time.Second,
			reason: "decorrelated round 4"},
		{name: "last attempt", doc: "maxAttempts: 3", round: 2, lo: ms, hi: 400 * ms, reason: "exponential round 2"},
		{name: "give up", doc: "maxAttempts: 3", round: 3, giveUp: true, reason: "exponential: max attempts 3 reached"},
		{name: "give up long after", doc: "policy: fixed\nmaxAttempts: 1", round: 500, giveUp: true,
			reason: "fixed: max attempts 1 reached"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			f := retrypolicy.New(retrypolicy.WithRand(seeded()))
			configure(t, f, tc.doc)
			resp, err := f.Schedule(t.Context(), &pluginv1.ScheduleRequest{
				StreamId: "stream-1", Zone: "zone-1",
				Failing:   failing("MeshTimeout", "Mesh", "MeshRetry", "Mesh", "MeshTimeout"),
				Round:     tc.round,
				LastDelay: durationpb.New(tc.last),
			})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.GetKinds()).To(Equal([]string{"Mesh", "MeshRetry", "MeshTimeout"}), "sorted and deduplicated")
			g.Expect(resp.GetGiveUp()).To(Equal(tc.giveUp))
			g.Expect(resp.GetReason()).To(Equal(tc.reason))
			if tc.giveUp {
				g.Expect(resp.GetDelay().AsDuration()).To(BeZero())
				return
			}
			d := resp.GetDelay().AsDuration()
			g.Expect(d).To(BeNumerically(">", 0))
			g.Expect(d).To(BeNumerically("<=", f.Policy().MaxDelay()))
			if tc.delay != 0 {
				g.Expect(d).To(Equal(tc.delay))
			} else {
				g.Expect(d).To(BeNumerically(">=", tc.lo))
				g.Expect(d).To(BeNumerically("<=", tc.hi))
			}
		})
	}
}

func TestForcerScheduleExactWithSeed(t *testing.T) {
	g := NewWithT(t)
	f := retrypolicy.New(retrypolicy.WithRand(seeded()))
	var got []time.Duration
	for round := range uint32(4) {
		resp, err := f.Schedule(t.Context(), &pluginv1.ScheduleRequest{Failing: failing("Mesh"), Round: round})
		g.Expect(err).NotTo(HaveOccurred())
		got = append(got, resp.GetDelay().AsDuration())
	}
	// The same draws as TestExponentialFullJitterExactWithSeed.
	g.Expect(got).To(Equal([]time.Duration{77167954, 123670809, 313986773, 637480667}))
}

func TestForcerScheduleCanceledContext(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := retrypolicy.New().Schedule(ctx, &pluginv1.ScheduleRequest{Failing: failing("Mesh")})
	g.Expect(err).To(MatchError(context.Canceled))
}

func TestForcerScheduleHandlesTenThousandKinds(t *testing.T) {
	g := NewWithT(t)
	const n = 10_000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("resource-%05d", i)
	}
	fk := make([]*pluginv1.FailingKind, 0, 2*n)
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("Kind%05d", i)
	}
	for i := n - 1; i >= 0; i-- { // reversed, and every kind twice
		fk = append(fk, &pluginv1.FailingKind{Kind: want[i], RejectedNames: names}, &pluginv1.FailingKind{Kind: want[i]})
	}
	resp, err := retrypolicy.New().Schedule(t.Context(), &pluginv1.ScheduleRequest{Failing: fk, Round: 5})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetKinds()).To(Equal(want))
	g.Expect(resp.GetDelay().AsDuration()).To(BeNumerically(">", 0))
}

// TestForcerIsSafeForConcurrentUse runs 100 goroutines scheduling while the policy is swapped
// under them; run it with -race.
func TestForcerIsSafeForConcurrentUse(t *testing.T) {
	g := NewWithT(t)
	f := retrypolicy.New(retrypolicy.WithRand(seeded()))
	docs := []string{"", "policy: fixed\ndelay: 2s", "policy: decorrelated\nmax: 10s", "jitter: none\nmaxAttempts: 50"}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Go(func() {
			for round := range uint32(100) {
				if i%25 == 0 && round%10 == 0 {
					_, _ = f.Configure(t.Context(), &pluginv1.ConfigureRequest{Document: []byte(docs[(i+int(round))%len(docs)])})
				}
				resp, err := f.Schedule(t.Context(), &pluginv1.ScheduleRequest{
					StreamId: fmt.Sprintf("stream-%d", i), Failing: failing("Mesh", "MeshTimeout"),
					Round: round, LastDelay: durationpb.New(time.Duration(round) * ms),
				})
				switch {
				case err != nil:
					errs <- err
					return
				case resp.GetGiveUp():
					if round < 50 {
						errs <- fmt.Errorf("round %d: gave up early", round)
						return
					}
				case resp.GetDelay().AsDuration() <= 0 || resp.GetDelay().AsDuration() > 30*time.Second:
					errs <- fmt.Errorf("round %d: delay %s out of bounds", round, resp.GetDelay().AsDuration())
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		g.Expect(err).NotTo(HaveOccurred())
	}
}

// TestForcerOverGRPC serves a Forcer through shared's gRPC adapters: InvalidArgument and its
// field survive the trip, and a schedule comes back intact.
func TestForcerOverGRPC(t *testing.T) {
	g := NewWithT(t)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	g.Expect((&shared.RetryForcerPlugin{Impl: retrypolicy.New()}).GRPCServer(nil, srv)).To(Succeed())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = conn.Close() })
	c := shared.NewRetryForcerClient(conn)

	_, err = c.Configure(t.Context(), &pluginv1.ConfigureRequest{Document: []byte("factor: 0.5")})
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(status.Convert(err).Message()).To(Equal("factor: must be >= 1, got 0.5"))

	_, err = c.Schedule(t.Context(), &pluginv1.ScheduleRequest{Failing: failing("Mesh", "")})
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(status.Convert(err).Message()).To(Equal("failing[1].kind: must not be empty"))

	resp, err := c.Schedule(t.Context(), &pluginv1.ScheduleRequest{Failing: failing("MeshTimeout", "Mesh"), Round: 1})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetKinds()).To(Equal([]string{"Mesh", "MeshTimeout"}))
	g.Expect(resp.GetDelay().AsDuration()).To(BeNumerically("~", 100*ms, 100*ms))
}

// BenchmarkSchedule measures the in-process policy, as the host's built-in mode runs it.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{1, 3, 32, 10_000} {
		b.Run(fmt.Sprintf("kinds=%d", n), func(b *testing.B) {
			kinds := make([]string, n)
			for i := range kinds {
				kinds[i] = fmt.Sprintf("Kind%05d", n-i)
			}
			req := &pluginv1.ScheduleRequest{StreamId: "s", Zone: "z", Failing: failing(kinds...), Round: 3,
				LastDelay: durationpb.New(400 * ms)}
			f := retrypolicy.New(retrypolicy.WithRand(seeded()))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.Schedule(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("parallel", func(b *testing.B) {
		f := retrypolicy.New(retrypolicy.WithRand(seeded()))
		req := &pluginv1.ScheduleRequest{Failing: failing("Mesh", "MeshTimeout", "MeshRetry"), Round: 3}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := f.Schedule(context.Background(), req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

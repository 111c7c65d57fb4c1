package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// giveUpAttempts is the maxAttempts the give-up check sets when it derives its document.
const giveUpAttempts = 3

// giveUpHint says how to give the give-up check the document it needs.
const giveUpHint = "If the plugin spells its limit otherwise (per kind, say), give a policy document that makes it give up after a few rounds with " +
	"--give-up-config FILE (kds-host plugin verify; -give-up-config FILE with go test, GiveUpConfig in conformance.Options)"

var retryForcerChecks = []check{
	{CheckRetryConfigure, "Configure accepts the plugin's own sample_config (and --config)", checkConfigure, false},
	{CheckRetryConfigureMalformed, "Configure answers malformed documents with InvalidArgument and keeps its policy", checkConfigureMalformed, false},
	{CheckRetryScheduleBounds, "every delay is positive and within max_delay; kinds name failing kinds", checkScheduleBounds, false},
	{CheckRetryHostBounds, "every answer is within the host's bounds (delay up to the request's max_delay, reasons up to 1 KiB, kinds and held names from the request)", checkHostBounds, false},
	{CheckRetryFloor, "later rounds do not shrink below the policy's floor (its min_delay, or the smallest first-round delay)", checkFloor, false},
	{CheckRetryResetAfterACK, "after the host resets the round (an ACK), round 0 is a first round again", checkResetAfterACK, false},
	{CheckRetryGiveUp, "gives up when its policy document says so", checkGiveUp, false},
	{CheckRetryEmptyInput, "an empty request is answered or refused with InvalidArgument, without a crash", checkScheduleEmpty, false},
	{CheckRetryBadInput, "bad input is answered or refused with InvalidArgument, without a crash", checkScheduleBadInput, false},
	{CheckRetryLargeInput, fmt.Sprintf("a request with %d rejected names is answered", LargeInput), checkScheduleLarge, false},
	{CheckRetryConcurrency, fmt.Sprintf("%d concurrent Schedule calls are all answered", Concurrency), checkScheduleConcurrency, false},
	{CheckRetryLatency, fmt.Sprintf("Schedule p99 latency under %s", MaxP99Latency), checkScheduleLatency, false},
}

// scheduleRequest is a typical request: two failing kinds on one stream.
func scheduleRequest(stream string, round uint32, last time.Duration) *pluginv1.ScheduleRequest {
	first := timestamppb.New(time.Now().Add(-time.Minute))
	req := &pluginv1.ScheduleRequest{
		StreamId: stream,
		Zone:     "zone-1",
		Round:    round,
		Failing: []*pluginv1.FailingKind{
			{Kind: "Mesh", RejectedNames: []string{"default"}, ErrorDetail: "admission webhook not ready", NackCount: round + 1, FirstNack: first},
			{Kind: "MeshTimeout", RejectedNames: []string{"default/timeout-1", "default/timeout-2"}, ErrorDetail: "mesh default not found", NackCount: round + 1, FirstNack: first},
		},
	}
	if round > 0 {
		req.LastDelay = durationpb.New(last)
	}
	return req
}

// schedule asks Schedule, as the host does: the request carries the host's maximum delay
// (--retry-max-delay) in max_delay.
func (c *checkRun) schedule(req *pluginv1.ScheduleRequest) (*pluginv1.ScheduleResponse, error) {
	if req.MaxDelay == nil {
		req.MaxDelay = durationpb.New(c.opts.Bounds.MaxDelay)
	}
	return call(c, "RetryForcer.Schedule", func(ctx context.Context) (*pluginv1.ScheduleResponse, error) {
		return c.rf.Schedule(ctx, req)
	})
}

// mustSchedule calls Schedule and holds the answer to the schedule rules.
func (c *checkRun) mustSchedule(req *pluginv1.ScheduleRequest, where string) *pluginv1.ScheduleResponse {
	resp, err := c.schedule(req)
	if err != nil {
		c.callFailed(where, err)
	}
	c.validSchedule(resp, req, where, c.maxDelay)
	return resp
}

// validSchedule holds a schedule to the rules: give up, park every rejected name of the request
// (then the delay is ignored), or a positive delay within maxDelay; the kinds it names are
// failing kinds. (The host's bounds, the request's max_delay among them, are the host-bounds
// check's.)
func (c *checkRun) validSchedule(resp *pluginv1.ScheduleResponse, req *pluginv1.ScheduleRequest, where string, maxDelay time.Duration) {
	if failing := req.GetFailing(); len(failing) > 0 {
		names := make([]string, len(failing))
		for i, f := range failing {
			names[i] = f.GetKind()
		}
		for _, k := range resp.GetKinds() {
			if !slices.Contains(names, k) {
				c.failf("%s: kinds must name only failing kinds (%s), got %q", where, strings.Join(names, ", "), k)
			}
		}
	}
	if resp.GetGiveUp() || shared.ParksAll(req, resp) {
		return
	}
	if resp.GetDelay() == nil {
		c.failf("%s: the schedule has no delay, does not give up and does not park every rejected name: a delay must be positive unless give_up is set or hold names every rejected name of the request (%s)",
			where, docSection("schedule"))
	}
	if err := resp.GetDelay().CheckValid(); err != nil {
		c.failf("%s: the delay is not a valid duration: %v", where, err)
	}
	d := resp.GetDelay().AsDuration()
	if d <= 0 {
		c.failf("%s: the delay must be positive, got %s", where, d)
	}
	if maxDelay > 0 && d > maxDelay {
		c.failf("%s: the delay %s exceeds the max_delay the plugin declares in Describe, %s", where, d, maxDelay)
	}
}

// needMaxDelay fails a check that holds delays to max_delay when Describe gave none.
func (c *checkRun) needMaxDelay() {
	if c.maxDelay <= 0 {
		c.failf("cannot check schedules without a max_delay from Describe (see %s)", CheckDescribe)
	}
}

func (c *checkRun) configure(doc []byte) (*pluginv1.ConfigureResponse, error) {
	return call(c, "RetryForcer.Configure", func(ctx context.Context) (*pluginv1.ConfigureResponse, error) {
		return c.rf.Configure(ctx, &pluginv1.ConfigureRequest{Document: doc})
	})
}

// declaredMaxDelay asks Describe for max_delay under the policy in force.
func (c *checkRun) declaredMaxDelay(after string) time.Duration {
	d, err := call(c, "RetryForcer.Describe", c.rf.Describe)
	if err != nil {
		c.callFailed("Describe after "+after, err)
	}
	m := d.GetMaxDelay()
	if m == nil || m.CheckValid() != nil || m.AsDuration() <= 0 {
		c.failf("after %s, Describe gives no valid positive max_delay (%v)", after, m)
	}
	return m.AsDuration()
}

func checkConfigure(c *checkRun) {
	sample := []byte(c.rfDesc.GetSampleConfig())
	if len(sample) == 0 {
		c.failf("Describe gives no sample_config to configure (see %s)", CheckDescribe)
	}
	resp, err := c.configure(sample)
	if err != nil {
		c.callFailed("Configure refused the plugin's own sample_config", err)
	}
	c.config = sample
	source := "sample_config"
	if len(c.opts.Config) > 0 {
		resp, err = c.configure(c.opts.Config)
		if err != nil {
			c.callFailed("Configure refused the document given with --config", err)
		}
		c.config = c.opts.Config
		source = "--config"
	}
	c.maxDelay = c.declaredMaxDelay("Configure")
	c.notef("checks run under %s: policy %q, max_delay %s", source, resp.GetPolicy(), c.maxDelay)
}

// malformedDocuments are policy documents no plugin can accept.
var malformedDocuments = []struct{ name, doc string }{
	{"broken YAML", "policy: [unclosed\n  delay: {"},
	{"binary garbage", "\x00\x01\x02\xff\xfe not a policy document \x00"},
	{"a list, not a mapping", "[1, 2, 3]"},
}

func checkConfigureMalformed(c *checkRun) {
	c.needMaxDelay()
	for _, m := range malformedDocuments {
		_, err := c.configure([]byte(m.doc))
		if err == nil {
			c.failf("Configure accepted a malformed document (%s): %q. It must answer InvalidArgument naming what is wrong.", m.name, m.doc)
		}
		if status.Code(err) != codes.InvalidArgument {
			c.callFailed(fmt.Sprintf("Configure with %s must fail with InvalidArgument", m.name), err)
		}
		c.g.Expect(status.Convert(err).Message()).NotTo(gomega.BeEmpty(), "Configure with %s: InvalidArgument must say what is wrong", m.name)
	}
	c.g.Expect(dur(c.declaredMaxDelay("refused documents"))).To(gomega.Equal(dur(c.maxDelay)),
		"after Configure refused a document, the previous policy must stay in force; max_delay changed")
	_, err := c.configure([]byte(malformedDocuments[0].doc))
	c.notef("e.g. %s", status.Convert(err).Message())
}

func checkScheduleBounds(c *checkRun) {
	c.needMaxDelay()
	const sequences, rounds = 4, 30
	calls, lo, hi := 0, time.Duration(math.MaxInt64), time.Duration(0)
	for seq := range sequences {
		var last time.Duration
		for round := range uint32(rounds) {
			req := scheduleRequest(fmt.Sprintf("conformance-bounds-%d", seq), round, last)
			resp := c.mustSchedule(req, fmt.Sprintf("Schedule round %d (last_delay %s)", round, last))
			calls++
			if resp.GetGiveUp() {
				break
			}
			last = resp.GetDelay().AsDuration()
			lo, hi = min(lo, last), max(hi, last)
		}
	}
	if hi == 0 {
		c.notef("%d schedules, every one gives up", calls)
		return
	}
	c.notef("%d schedules over rounds 0-%d: delays %s to %s, max_delay %s", calls, rounds-1, round(lo), round(hi), c.maxDelay)
}

// boundsRequest is a request as a zone with causes makes it: two failing kinds, each rejected
// name with its cause and attempts, so a policy that holds INVALID names gets to.
func boundsRequest(stream string, round uint32, last time.Duration) *pluginv1.ScheduleRequest {
	req := scheduleRequest(stream, round, last)
	causes := []kdsv1.Cause{kdsv1.Cause_CAUSE_TRANSIENT, kdsv1.Cause_CAUSE_MISSING_OWNER, kdsv1.Cause_CAUSE_INVALID}
	i := 0
	for _, f := range req.Failing {
		for _, n := range f.RejectedNames {
			rn := &pluginv1.RejectedName{Name: n, Cause: causes[i%len(causes)], Attempts: round + 1, CauseAttempts: round + 1}
			if rn.Cause == kdsv1.Cause_CAUSE_MISSING_OWNER {
				rn.MissingOwner = &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}
			}
			f.Rejected = append(f.Rejected, rn)
			i++
		}
	}
	return req
}

func checkHostBounds(c *checkRun) {
	c.needMaxDelay()
	bounds := c.opts.Bounds
	const refused = "the host refuses such an answer: it counts an error against the plugin, logs a WARN line naming the field, and its built-in policy decides instead (" +
		ProtocolDoc + "#host-bounds)"
	// Requests as a zone with causes makes them, and as a plain xDS zone does (no causes).
	requests := []func(string, uint32, time.Duration) *pluginv1.ScheduleRequest{boundsRequest, boundsRequest, scheduleRequest}
	const rounds = 30
	calls, held := 0, 0
	for seq, request := range requests {
		var last time.Duration
		for round := range uint32(rounds) {
			req := request(fmt.Sprintf("conformance-host-bounds-%d", seq), round, last)
			where := fmt.Sprintf("Schedule round %d (last_delay %s)", round, last)
			resp, err := c.schedule(req)
			if err != nil {
				c.callFailed(where, err)
			}
			calls++
			if err := bounds.CheckSchedule(req, resp); err != nil {
				if be, ok := errors.AsType[*shared.BoundsError](err); ok && be.Field == "delay" {
					c.failf("%s: %v, the request's max_delay: %s. Cap every delay at ScheduleRequest.max_delay", where, err, refused)
				}
				c.failf("%s: %v: %s", where, err, refused)
			}
			held += len(resp.GetHold())
			if resp.GetGiveUp() || shared.ParksAll(req, resp) {
				break
			}
			last = resp.GetDelay().AsDuration()
		}
	}
	capped := ""
	if c.maxDelay > bounds.MaxDelay {
		capped = fmt.Sprintf(" (the policy's own max_delay %s is over it: capped at the request's max_delay)", c.maxDelay)
	}
	c.notef("%d answers within the host's bounds (delay at most %s%s, reasons at most %d bytes); %d names held", calls, bounds.MaxDelay, capped, bounds.MaxReason, held)
}

// firstRounds asks round 0 n times, from workers goroutines, and returns the delays of the
// answers that did not give up.
func (c *checkRun) firstRounds(n, workers int) []time.Duration {
	type answer struct {
		resp *pluginv1.ScheduleResponse
		req  *pluginv1.ScheduleRequest
		err  error
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				req := scheduleRequest(fmt.Sprintf("conformance-first-%d", i), 0, 0)
				resp, err := c.schedule(req)
				answers[i] = answer{resp, req, err}
			}
		})
	}
	wg.Wait()
	var delays []time.Duration
	for _, a := range answers {
		if a.err != nil {
			c.callFailed("Schedule round 0", a.err)
		}
		c.validSchedule(a.resp, a.req, "Schedule round 0", c.maxDelay)
		if !a.resp.GetGiveUp() {
			delays = append(delays, a.resp.GetDelay().AsDuration())
		}
	}
	return delays
}

func checkFloor(c *checkRun) {
	c.needMaxDelay()
	declared := c.declaredMinDelay()
	first := c.firstRounds(500, 10)
	if len(first) == 0 {
		c.skipf("the policy in force gives up at round 0, so no round follows another")
	}
	// Without a declared min_delay the floor is inferred: the smallest of many first-round
	// delays, and a later round may fall to half of it (jitter may draw a first round that is
	// above the policy's true floor), not below. A declared min_delay holds every round to it.
	floor := slices.Min(first)
	limit, rule := floor/2, fmt.Sprintf("the smallest of %d first-round delays is %s, and no later round may be under half of it", len(first), floor)
	if declared > 0 {
		// The host's maximum wins over the policy's floor: a delay is capped at max_delay.
		declared = min(declared, c.opts.Bounds.MaxDelay)
		c.g.Expect(dur(floor)).To(gomega.BeNumerically(">=", dur(declared)),
			"Schedule round 0: a delay of %s is under the min_delay %s the plugin declares", floor, declared)
		floor, limit, rule = declared, declared, fmt.Sprintf("the plugin declares min_delay %s", declared)
	}
	const chains, rounds = 2, 40
	calls := 0
	for chain := range chains {
		last := first[chain%len(first)]
		for round := uint32(1); round < rounds; round++ {
			req := scheduleRequest(fmt.Sprintf("conformance-floor-%d", chain), round, last)
			where := fmt.Sprintf("Schedule round %d (last_delay %s)", round, last)
			resp := c.mustSchedule(req, where)
			calls++
			if resp.GetGiveUp() {
				break
			}
			d := resp.GetDelay().AsDuration()
			c.g.Expect(dur(d)).To(gomega.BeNumerically(">=", dur(limit)),
				"%s: the delay shrank below the policy's floor: %s", where, rule)
			last = d
		}
	}
	if declared > 0 {
		c.notef("floor %s (declared min_delay); %d first and %d later rounds all at least %s", round(floor), len(first), calls, round(limit))
		return
	}
	c.notef("floor %s (smallest of %d first-round delays; no min_delay declared); %d later rounds all at least %s", round(floor), len(first), calls, round(limit))
}

// declaredMinDelay is the min_delay Describe declares for the policy in force, or 0 when it
// declares none.
func (c *checkRun) declaredMinDelay() time.Duration {
	d, err := call(c, "RetryForcer.Describe", c.rf.Describe)
	if err != nil {
		c.callFailed("Describe", err)
	}
	m := d.GetMinDelay()
	if m == nil {
		return 0
	}
	if m.CheckValid() != nil || m.AsDuration() <= 0 {
		c.failf("Describe gives a min_delay that is not a valid positive duration (%v)", m)
	}
	if c.maxDelay > 0 && m.AsDuration() > c.maxDelay {
		c.failf("Describe gives a min_delay %s above its max_delay %s", m.AsDuration(), c.maxDelay)
	}
	return m.AsDuration()
}

func checkResetAfterACK(c *checkRun) {
	c.needMaxDelay()
	first := c.firstRounds(50, 10)
	if len(first) == 0 {
		c.skipf("the policy in force gives up at round 0")
	}
	limit := 2 * slices.Max(first)
	const stream = "conformance-reset"
	var last time.Duration
	for round := range uint32(30) {
		resp := c.mustSchedule(scheduleRequest(stream, round, last), fmt.Sprintf("Schedule round %d", round))
		if resp.GetGiveUp() {
			break
		}
		last = resp.GetDelay().AsDuration()
	}
	for i := range 10 {
		where := fmt.Sprintf("Schedule round 0 (after 30 rounds on the same stream, reset %d)", i+1)
		resp := c.mustSchedule(scheduleRequest(stream, 0, 0), where)
		if resp.GetGiveUp() {
			c.failf("%s: gave up at round 0 after a reset, where a fresh stream gets a delay: the plugin keeps per-stream state, which belongs to the host", where)
		}
		c.g.Expect(dur(resp.GetDelay().AsDuration())).To(gomega.BeNumerically("<=", dur(limit)),
			"%s: round 0 after a reset must be a first round again (at most twice the largest first-round delay, %s): the plugin keeps per-stream state, which belongs to the host", where, limit/2)
	}
	c.notef("10 first rounds after a reset all at most %s (last delay before the reset %s)", round(limit), round(last))
}

// withMaxAttempts sets maxAttempts in a policy document that is a YAML or JSON mapping.
func withMaxAttempts(doc []byte, n int) ([]byte, error) {
	var m map[string]any
	if err := yaml.Unmarshal(doc, &m); err != nil {
		return nil, fmt.Errorf("it is not a YAML or JSON mapping: %w", err)
	}
	if m == nil {
		m = map[string]any{}
	}
	m["maxAttempts"] = n
	return yaml.Marshal(m)
}

func checkGiveUp(c *checkRun) {
	c.needMaxDelay()
	doc, derived := c.opts.GiveUpConfig, false
	if len(doc) == 0 {
		var err error
		if doc, err = withMaxAttempts(c.config, giveUpAttempts); err != nil {
			c.skipf("no give-up document: the suite cannot set maxAttempts in the policy document (%v). %s", err, giveUpHint)
		}
		derived = true
	}
	if _, err := c.configure(doc); err != nil {
		if derived && status.Code(err) == codes.InvalidArgument {
			c.skipf("the plugin refused its policy document with maxAttempts: %d set at the top level (%s). %s",
				giveUpAttempts, status.Convert(err).Message(), giveUpHint)
		}
		c.callFailed("Configure refused the give-up document given with --give-up-config", err)
	}
	restored := false
	defer func() {
		if !restored && len(c.config) > 0 {
			_, _ = c.configure(c.config) // best effort: the later checks run under c.config
		}
	}()
	maxDelay := c.declaredMaxDelay("Configure with the give-up document")
	const limit = 100
	giveUp, reason := -1, ""
	var last time.Duration
	for round := range uint32(limit) {
		req := scheduleRequest("conformance-give-up", round, last)
		where := fmt.Sprintf("Schedule round %d under the give-up document", round)
		resp, err := c.schedule(req)
		if err != nil {
			c.callFailed(where, err)
		}
		c.validSchedule(resp, req, where, maxDelay)
		if resp.GetGiveUp() {
			giveUp, reason = int(round), resp.GetReason()
			break
		}
		last = resp.GetDelay().AsDuration()
	}
	if len(c.config) > 0 {
		if _, err := c.configure(c.config); err != nil {
			c.callFailed("Configure refused the document it accepted before the give-up check", err)
		}
	}
	restored = true

	if !derived {
		if giveUp < 0 {
			c.failf("under the document given with --give-up-config the plugin did not give up in %d rounds", limit)
		}
		c.notef("gave up at round %d: %q", giveUp, reason)
		return
	}
	if giveUp < 0 && !slices.Contains(c.rfDesc.GetCapabilities(), "max-attempts") {
		c.skipf("the plugin accepted maxAttempts: %d but did not give up in %d rounds, and does not declare the max-attempts capability. %s",
			giveUpAttempts, limit, giveUpHint)
	}
	if giveUp < 0 {
		c.failf("configured with maxAttempts: %d at the top level of its policy document (and declaring the max-attempts capability), the plugin did not give up in %d rounds. %s",
			giveUpAttempts, limit, giveUpHint)
	}
	if giveUp < 1 || giveUp > giveUpAttempts {
		c.failf("configured with maxAttempts: %d at the top level of its policy document, the plugin must retry at least once and give up by round %d; it gave up at round %d. %s",
			giveUpAttempts, giveUpAttempts, giveUp, giveUpHint)
	}
	c.notef("with maxAttempts: %d it gave up at round %d: %q", giveUpAttempts, giveUp, reason)
}

func checkScheduleEmpty(c *checkRun) {
	c.needMaxDelay()
	for _, tc := range []struct {
		name string
		req  *pluginv1.ScheduleRequest
	}{
		{"an empty request", &pluginv1.ScheduleRequest{}},
		{"no failing kinds", &pluginv1.ScheduleRequest{StreamId: "conformance-empty", Zone: "zone-1"}},
		{"a failing kind with no rejected names", &pluginv1.ScheduleRequest{StreamId: "conformance-empty", Zone: "zone-1",
			Failing: []*pluginv1.FailingKind{{Kind: "Mesh"}}}},
	} {
		where := "Schedule with " + tc.name
		resp, err := c.schedule(tc.req)
		if c.answeredOrInvalid(where, err) {
			c.validSchedule(resp, tc.req, where, c.maxDelay)
		}
	}
	c.alive("empty requests")
}

func checkScheduleBadInput(c *checkRun) {
	c.needMaxDelay()
	maxDuration := durationpb.New(time.Duration(math.MaxInt64))
	for _, tc := range []struct {
		name string
		req  *pluginv1.ScheduleRequest
	}{
		{"a failing kind without a kind", &pluginv1.ScheduleRequest{Zone: "zone-1", Failing: []*pluginv1.FailingKind{{RejectedNames: []string{"x"}}}}},
		{"a negative last_delay", withLast(scheduleRequest("conformance-bad", 3, 0), durationpb.New(-time.Second))},
		{"an invalid last_delay (seconds and nanos of opposite signs)", withLast(scheduleRequest("conformance-bad", 3, 0), &durationpb.Duration{Seconds: 1, Nanos: -1})},
		{"round 4294967295 and the largest last_delay", withLast(scheduleRequest("conformance-bad", math.MaxUint32, 0), maxDuration)},
	} {
		where := "Schedule with " + tc.name
		resp, err := c.schedule(tc.req)
		if c.answeredOrInvalid(where, err) {
			c.validSchedule(resp, tc.req, where, c.maxDelay)
		}
	}
	c.alive("bad requests")
}

func withLast(req *pluginv1.ScheduleRequest, last *durationpb.Duration) *pluginv1.ScheduleRequest {
	req.LastDelay = last
	return req
}

func checkScheduleLarge(c *checkRun) {
	c.needMaxDelay()
	const kinds = 32
	req := &pluginv1.ScheduleRequest{StreamId: "conformance-large", Zone: "zone-1", Round: 1, LastDelay: durationpb.New(100 * time.Millisecond)}
	for k := range kinds {
		req.Failing = append(req.Failing, &pluginv1.FailingKind{Kind: fmt.Sprintf("Kind%02d", k), NackCount: 2, ErrorDetail: "rejected"})
	}
	for i := range LargeInput {
		f := req.Failing[i%kinds]
		f.RejectedNames = append(f.RejectedNames, fmt.Sprintf("default/resource-%05d", i))
	}
	start := time.Now()
	c.mustSchedule(req, fmt.Sprintf("Schedule with %d rejected names in %d kinds", LargeInput, kinds))
	c.notef("answered in %s", round(time.Since(start)))
	c.alive("a large request")
}

func checkScheduleConcurrency(c *checkRun) {
	c.needMaxDelay()
	reqs := make([]*pluginv1.ScheduleRequest, Concurrency)
	for i := range reqs {
		reqs[i] = scheduleRequest(fmt.Sprintf("conformance-concurrent-%d", i), uint32(i%8), time.Duration(i%8)*100*time.Millisecond)
	}
	answers := concurrently(c, "Schedule", func(i int) (*pluginv1.ScheduleResponse, error) { return c.schedule(reqs[i]) })
	for i, resp := range answers {
		c.validSchedule(resp, reqs[i], fmt.Sprintf("concurrent Schedule call %d of %d", i+1, Concurrency), c.maxDelay)
	}
}

func checkScheduleLatency(c *checkRun) {
	c.needMaxDelay()
	lat := c.latency("Schedule", func(i int) error {
		_, err := c.schedule(scheduleRequest("conformance-latency", uint32(i%10), time.Duration(i%10)*100*time.Millisecond))
		return err
	})
	c.reportLatency(lat)
}

// latencySamples is how many calls a latency check measures, after a warm-up.
const latencySamples = 200

// latency measures latencySamples sequential calls, sorted.
func (c *checkRun) latency(op string, fn func(i int) error) []time.Duration {
	for i := range 10 {
		if err := fn(i); err != nil {
			c.callFailed(op+" (warm-up)", err)
		}
	}
	lat := make([]time.Duration, latencySamples)
	for i := range lat {
		start := time.Now()
		if err := fn(i); err != nil {
			c.callFailed(op, err)
		}
		lat[i] = time.Since(start)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat
}

func (c *checkRun) reportLatency(lat []time.Duration) {
	p := func(q float64) time.Duration { return lat[int(math.Ceil(q*float64(len(lat))))-1] }
	c.g.Expect(dur(p(0.99))).To(gomega.BeNumerically("<", dur(MaxP99Latency)),
		"p99 latency over %d calls (p50 %s, max %s)", len(lat), round(p(0.5)), round(lat[len(lat)-1]))
	c.notef("p50 %s, p99 %s, max %s over %d calls", round(p(0.5)), round(p(0.99)), round(lat[len(lat)-1]), len(lat))
}

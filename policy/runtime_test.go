package policy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared/launch"
)

func TestARetryForcerPluginIsConfiguredAndAnswers(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	rt := start(t, config(policy.Spec{Path: bin, Document: doc("policy: fixed\ndelay: 1234ms\n")}))

	d, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(1234 * time.Millisecond))

	st := statusOf(rt, "retry-forcer")
	g.Expect(st.Path).To(Equal(bin))
	g.Expect(st.State).To(Equal(policy.StateRunning))
	g.Expect(st.Serves).To(Equal([]string{policy.RetryForcerService}))
	g.Expect(st.Policy).To(Equal("fixed delay=1.234s"))
	g.Expect(st.Version).NotTo(BeEmpty())
	g.Expect(st.Checksum).To(Equal("sha256:" + sha256File(t, bin)))
	g.Expect(alive(st.PID)).To(BeTrue())
	g.Expect(st.Calls).To(BeEquivalentTo(1))
	g.Expect(st.Latency.P50).To(BeNumerically(">", 0))

	b := statusOf(rt, policy.Builtin)
	g.Expect(b.State).To(Equal(policy.StateBuiltin))
	g.Expect(b.Serves).To(Equal([]string{policy.OwnerCheckService}))
	g.Expect(b.FallbackFor).To(Equal([]string{policy.RetryForcerService}))

	// The owner check has no plugin: the built-in one answers.
	p, err := rt.OwnerCheck().Predict(context.Background(), predictReq)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.GetPredictions()).To(HaveLen(2))
	g.Expect(statusOf(rt, policy.Builtin).Calls).To(BeEquivalentTo(1))

	rt.Close()
	g.Eventually(func() bool { return alive(st.PID) }, patience).Should(BeFalse())
	// Closed, the runtime still answers, through the built-in policy.
	_, err = schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
}

func TestWithoutPluginsTheBuiltinAnswersBoth(t *testing.T) {
	g := NewWithT(t)
	rt := start(t, config(policy.Spec{Path: policy.Builtin, Document: doc("policy: fixed\ndelay: 3s\n")}))
	d, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(3 * time.Second))
	st := rt.Status()
	g.Expect(st).To(HaveLen(1))
	g.Expect(st[0].Serves).To(Equal([]string{policy.RetryForcerService, policy.OwnerCheckService}))
	g.Expect(st[0].Policy).To(Equal("fixed delay=3s"))
}

func TestOneBinaryMayServeBoth(t *testing.T) {
	g := NewWithT(t)
	rt := start(t, config(policy.Spec{Path: bothBin(t)}))
	st := rt.Status()
	g.Expect(st).To(HaveLen(2))
	g.Expect(st[0].Serves).To(Equal([]string{policy.RetryForcerService, policy.OwnerCheckService}))
	g.Expect(st[1].Serves).To(BeEmpty())
	g.Expect(st[1].FallbackFor).To(Equal([]string{policy.RetryForcerService}))

	p, err := rt.OwnerCheck().Predict(context.Background(), predictReq)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.GetPredictions()).To(HaveLen(2))
	_, err = schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(statusOf(rt, st[0].Name).Calls).To(BeEquivalentTo(2))
	g.Expect(statusOf(rt, policy.Builtin).Calls).To(BeZero())
}

func TestPolicyDocumentsByName(t *testing.T) {
	rf, oc := retryForcerBin(t), ownerCheckBin(t)
	fixed := policy.Document{Source: "fixed.yaml", Data: []byte("policy: fixed\ndelay: 2s\n")}
	for _, tc := range []struct {
		name    string
		list    []policy.Spec
		docs    map[string]policy.Document
		delay   time.Duration
		wantErr string
	}{
		{"by Describe name", []policy.Spec{{Path: rf}}, map[string]policy.Document{"retry-forcer": fixed}, 2 * time.Second, ""},
		{"builtin by name", nil, map[string]policy.Document{"builtin": fixed}, 2 * time.Second, ""},
		{"a name no plugin has", []policy.Spec{{Path: rf}}, map[string]policy.Document{"retry-forcr": fixed}, 0,
			`a policy document is given for plugin "retry-forcr", but no plugin has that name (plugins: builtin, retry-forcer (retry-forcer))`},
		{"an owner check takes none", []policy.Spec{{Path: oc}}, map[string]policy.Document{"owner-check": fixed}, 0,
			"plugin owner-check serves only OwnerCheck, which takes no policy document (fixed.yaml)"},
		{"a bad document", []policy.Spec{{Path: rf, Document: doc("policy: fixed\nfactor: 2\n")}}, nil, 0,
			"configure plugin retry-forcer with test: plugin RetryForcer.Configure: InvalidArgument: factor: does not apply to policy fixed"},
		{"a bad document for builtin", []policy.Spec{{Path: policy.Builtin, Document: doc("policy: nope\n")}}, nil, 0,
			`configure the built-in retry policy with test: policy: unknown policy "nope"`},
		{"two retry forcers", []policy.Spec{{Path: rf}, {Path: bothBin(t)}}, nil, 0, "both serve RetryForcer: run one of them"},
		{"listed twice", []policy.Spec{{Path: rf}, {Path: rf}}, nil, 0, "is listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := config(tc.list...)
			cfg.Plugins.Documents = tc.docs
			rt, err := policy.New(cfg)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			defer rt.Close()
			d, err := schedule(rt)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(d).To(Equal(tc.delay))
		})
	}
}

func sha256File(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestAWrongChecksumIsRefused(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	actual := sha256File(t, bin)
	wrong := strings.Repeat("ab", 32)
	spec, err := policy.ParseSpec(bin + "@sha256:" + wrong)
	g.Expect(err).NotTo(HaveOccurred())

	_, err = policy.New(config(spec))
	var ce *launch.ChecksumError
	g.Expect(errors.As(err, &ce)).To(BeTrue(), "got %v", err)
	g.Expect(err.Error()).To(ContainSubstring("expected sha256:" + wrong))
	g.Expect(err.Error()).To(ContainSubstring("actual sha256:" + actual))

	// The right pin runs.
	right, err := policy.ParseSpec(bin + "@sha256:" + actual)
	g.Expect(err).NotTo(HaveOccurred())
	rt := start(t, config(right))
	before := statusOf(rt, "retry-forcer")
	g.Expect(before.Checksum).To(Equal("sha256:" + actual))
	gen := rt.Generation()

	// A reload to a wrong pin keeps the running plugin and reports the error.
	err = rt.Reload(context.Background(), static(policy.Plugins{List: []policy.Spec{spec}}))
	g.Expect(errors.As(err, &ce)).To(BeTrue(), "got %v", err)
	after := statusOf(rt, "retry-forcer")
	g.Expect(after.PID).To(Equal(before.PID))
	g.Expect(after.State).To(Equal(policy.StateRunning))
	g.Expect(rt.LastReload().Error).To(ContainSubstring("expected sha256:" + wrong))
	_, err = schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())

	// So does a configuration that cannot be read.
	err = rt.Reload(context.Background(), func() (policy.Plugins, error) { return policy.Plugins{}, errors.New("config x.yaml: bad") })
	g.Expect(err).To(MatchError("config x.yaml: bad"))
	g.Expect(rt.LastReload().Error).To(Equal("config x.yaml: bad"))
	g.Expect(statusOf(rt, "retry-forcer").PID).To(Equal(before.PID))
	g.Expect(rt.Generation()).To(Equal(gen), "a failed reload leaves the same policies in force")
}

func TestABinaryThatIsNotAPluginFailsWithinTheStartTimeout(t *testing.T) {
	script, gone := silentProgram(t)

	for _, tc := range []struct {
		name, path string
		want       string
	}{
		{"a program that prints something else", testbin.Build(t, "./policy/testdata/notaplugin"),
			`it printed "notaplugin: hello, I am an ordinary program" instead of a handshake`},
		{"a program that says nothing", script, "no handshake within the start timeout (1s)"},
		{"a go-plugin plugin with another cookie", testbin.Build(t, "./policy/testdata/othercookie"),
			"it exited without a handshake; its stderr: This binary is a plugin. These are not meant to be executed directly."},
		{"a program that exits at once", "/bin/true", "it exited without a handshake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := config(policy.Spec{Path: tc.path})
			cfg.StartTimeout = time.Second
			done := make(chan error, 1)
			go func() {
				rt, err := policy.New(cfg)
				if err == nil {
					rt.Close()
				}
				done <- err
			}()
			var err error
			g.Eventually(done, patience).Should(Receive(&err), "no hang")
			g.Expect(err).To(MatchError(launch.ErrNotAPlugin))
			g.Expect(err.Error()).To(ContainSubstring("plugin " + tc.path + ": not a kds-host plugin"))
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
			t.Log(err)
		})
	}
	gone()
}

// silentProgram writes a plain program that says nothing and starts a child that holds its
// stdout: only a kill of the whole process group ends both. gone checks that both ended.
func silentProgram(t *testing.T) (path string, gone func()) {
	dir := t.TempDir()
	path = filepath.Join(dir, "silent.sh")
	err := os.WriteFile(path, []byte("#!/bin/sh\necho $$ > "+dir+"/sh.pid\nsleep 300 &\necho $! > "+dir+"/sleep.pid\nwait\n"), 0o755)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return path, func() {
		t.Helper()
		for _, f := range []string{"sh.pid", "sleep.pid"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			NewWithT(t).Expect(err).NotTo(HaveOccurred())
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			NewWithT(t).Eventually(func() bool { return alive(pid) }, patience).Should(BeFalse(), "%s %d left behind", f, pid)
		}
	}
}

func TestACanceledReloadStopsTheStartAtOnce(t *testing.T) {
	g := NewWithT(t)
	// A start timeout of an hour: the start ends because the reload is called off, not by
	// running out of time.
	cfg := config()
	cfg.StartTimeout = time.Hour
	rt := start(t, cfg)
	script, gone := silentProgram(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rt.Reload(ctx, static(policy.Plugins{List: []policy.Spec{{Path: script}}})) }()
	var err error
	g.Eventually(done, patience).Should(Receive(&err))
	g.Expect(err).To(MatchError(context.DeadlineExceeded))
	g.Expect(err.Error()).To(Equal("plugin " + script + ": context deadline exceeded"))
	gone()
	g.Expect(rt.Status()).To(HaveLen(1))
}

func TestAPluginsLogLinesAppearUnderItsName(t *testing.T) {
	g := NewWithT(t)
	var out syncBuffer
	cfg := config(policy.Spec{Path: retryForcerBin(t)})
	cfg.Logger = hostLogger(&hclog.LoggerOptions{Name: "kds-host", Level: hclog.Debug, Output: &out})
	start(t, cfg)
	// go-plugin's server logs its address as a JSON line on the plugin's stderr; the host's
	// client writes it into the host's log, under the plugin's name, at its level.
	g.Eventually(out.String, patience).Should(MatchRegexp(`\[DEBUG\] kds-host\.plugin\.retry-forcer: plugin address: .*network=unix`))
}

func TestAKilledPluginIsRestartedAndTheBuiltinAnswersMeanwhile(t *testing.T) {
	g := NewWithT(t)
	cfg := config(policy.Spec{Path: retryForcerBin(t), Document: doc("policy: fixed\ndelay: 1234ms\n")})
	cfg.BackoffMin = 2 * time.Second // the plugin stays down long enough to be seen down
	rt := start(t, cfg)
	first := statusOf(rt, "retry-forcer")
	gen := rt.Generation()

	g.Expect(syscall.Kill(first.PID, syscall.SIGKILL)).To(Succeed())
	// Down: calls fail at once (Unavailable) so the caller's fallback answers, or, when they
	// reach the dying process, fail fast too.
	g.Eventually(func() codes.Code {
		_, err := schedule(rt)
		return status.Code(err)
	}, patience, time.Millisecond).Should(Equal(codes.Unavailable))
	g.Eventually(func() string { return statusOf(rt, "retry-forcer").State }, patience, time.Millisecond).
		Should(Equal(policy.StateRestarting))
	_, err := schedule(rt)
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
	g.Expect(err.Error()).To(ContainSubstring("plugin retry-forcer is down (the plugin process exited"))
	fb, err := rt.Fallback().Schedule(context.Background(), scheduleReq)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(fb.GetDelay().AsDuration()).To(BeNumerically(">", 0))

	// Back: a new process with the same policy document.
	g.Eventually(func() string { return statusOf(rt, "retry-forcer").State }, patience, 5*time.Millisecond).
		Should(Equal(policy.StateRunning))
	second := statusOf(rt, "retry-forcer")
	g.Expect(second.PID).NotTo(Equal(first.PID))
	g.Expect(second.Restarts).To(Equal(1))
	g.Expect(second.LastError).To(ContainSubstring("the plugin process exited"))
	d, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(1234 * time.Millisecond))
	g.Expect(rt.Generation()).To(Equal(gen), "a restarted plugin is the same one: answers given before still hold")
}

func TestReloadSwapsThePolicy(t *testing.T) {
	g := NewWithT(t)
	bin := retryForcerBin(t)
	rt := start(t, config(policy.Spec{Path: bin, Document: doc("policy: exponential\njitter: none\nbase: 100ms\n")}))
	d, err := schedule(rt) // round 2
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(400 * time.Millisecond))
	old := statusOf(rt, "retry-forcer")
	gen := rt.Generation()

	g.Expect(rt.Reload(context.Background(), static(policy.Plugins{List: []policy.Spec{{Path: bin, Document: doc("policy: fixed\ndelay: 250ms\n")}}}))).To(Succeed())
	g.Expect(rt.Generation()).NotTo(Equal(gen), "another policy is in force: answers given before may not hold")
	gen = rt.Generation()
	d, err = schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(250 * time.Millisecond))
	now := statusOf(rt, "retry-forcer")
	g.Expect(now.PID).NotTo(Equal(old.PID))
	g.Expect(now.Policy).To(Equal("fixed delay=250ms"))
	g.Expect(alive(old.PID)).To(BeFalse(), "the old process is stopped when Reload returns")
	g.Expect(rt.LastReload().Error).To(BeEmpty())

	// Back to the built-in policy: no binary at all.
	g.Expect(rt.Reload(context.Background(), static(policy.Plugins{}))).To(Succeed())
	g.Expect(rt.Generation()).NotTo(Equal(gen))
	g.Expect(rt.Status()).To(HaveLen(1))
	g.Expect(alive(now.PID)).To(BeFalse())
	_, err = schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
}

func TestAnOwnerCheckPluginThatIsDownFailsFast(t *testing.T) {
	g := NewWithT(t)
	cfg := config(policy.Spec{Path: ownerCheckBin(t)})
	cfg.BackoffMin = time.Second
	rt := start(t, cfg)
	p, err := rt.OwnerCheck().Predict(context.Background(), predictReq)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.GetPredictions()[1].GetVerdict()).To(Equal(pluginv1.Verdict_VERDICT_WAIT))

	pid := statusOf(rt, "owner-check").PID
	g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
	g.Eventually(func() string { return statusOf(rt, "owner-check").State }, patience, time.Millisecond).Should(Equal(policy.StateRestarting))
	// The caller (the owner holds) fails open on this error, as docs/architecture.md says.
	_, err = rt.OwnerCheck().Predict(context.Background(), predictReq)
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
	g.Expect(statusOf(rt, policy.Builtin).Calls).To(BeZero(), "the built-in check does not stand in for the plugin")
	st := statusOf(rt, "owner-check")
	g.Expect(st.Calls).To(BeEquivalentTo(2))
	g.Expect(st.Errors).To(BeEquivalentTo(1))
}

// TestAnEmptyPolicyDocumentKeepsThePluginsDefaults: a document of whitespace only (an empty
// --plugin-config file) is no document: Configure is not called, and the plugin keeps its
// defaults. fixed-retry refuses an empty document (its delay is required), so a host that sent
// it would fail to start.
func TestAnEmptyPolicyDocumentKeepsThePluginsDefaults(t *testing.T) {
	g := NewWithT(t)
	bin := testbin.Build(t, "./examples/plugins/fixed-retry")
	rt := start(t, config(policy.Spec{Path: bin, Document: doc(" \n\t\n")}))
	d, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(500*time.Millisecond), "fixed-retry's default delay")
	g.Expect(statusOf(rt, "fixed-retry").Policy).To(BeEmpty(), "not configured")
}

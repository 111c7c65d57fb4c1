package conformance_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance"
)

// Run the suite against any plugin binary:
//
//	go test ./shared/conformance -run TestConformance -args -plugin PATH [-config FILE] [-give-up-config FILE]
var (
	pluginPath   = flag.String("plugin", "", "a plugin binary to check (default: the reference plugins and the example)")
	configPath   = flag.String("config", "", "a RetryForcer policy document to run the checks under")
	giveUpConfig = flag.String("give-up-config", "", "a RetryForcer policy document that makes the plugin give up")
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// verify runs the suite and logs the report.
func verify(t *testing.T, opts conformance.Options) conformance.Report {
	t.Helper()
	opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Error, Output: testWriter{t}})
	report := conformance.Run(context.Background(), opts)
	var b strings.Builder
	_ = report.Write(&b)
	t.Logf("conformance report:\n%s", b.String())
	return report
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// flagPath resolves a relative path given to a flag: go test runs in the package's folder, but a
// person types paths from where they are, usually the module root.
func flagPath(t *testing.T, path string) string {
	if path == "" || filepath.IsAbs(path) {
		return path
	}
	if _, err := os.Stat(path); err == nil {
		return path
	}
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, path)
}

func readFlagFile(t *testing.T, path string) []byte {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConformance checks the plugin named by -plugin, or else the reference plugins and the
// example: each must pass every check, and skip none.
func TestConformance(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	if *pluginPath != "" {
		report := verify(t, conformance.Options{Path: flagPath(t, *pluginPath),
			Config: readFlagFile(t, flagPath(t, *configPath)), GiveUpConfig: readFlagFile(t, flagPath(t, *giveUpConfig))})
		for _, c := range report.Failed() {
			t.Errorf("%s: %s", c.Name, c.Detail)
		}
		return
	}
	for _, tc := range []struct {
		pkg    string
		checks int
	}{
		{"./plugins/retry-forcer", 16},
		{"./plugins/owner-check", 11},
		{"./examples/plugins/fixed-retry", 16},
		// Built from plugin.v1 as it stood before rejection causes: the contract stays compatible.
		{"./shared/conformance/testdata/v1plugin", 16},
	} {
		t.Run(tc.pkg, func(t *testing.T) {
			g := NewWithT(t)
			report := verify(t, conformance.Options{Path: testbin.Build(t, tc.pkg)})
			g.Expect(report.Failed()).To(BeEmpty())
			g.Expect(report.Passed()).To(BeTrue())
			g.Expect(report.Err()).To(Succeed())
			g.Expect(report.Checks).To(HaveLen(tc.checks))
			for _, c := range report.Checks {
				g.Expect(c.Skipped).To(BeFalse(), "%s was skipped: %s", c.Name, c.Detail)
			}
			hs, _ := report.Check(conformance.CheckHandshake)
			g.Expect(hs.Detail).To(MatchRegexp(`protocol 1 over gRPC, AutoMTLS \(TLS 1\.[23], the plugin's certificate for localhost`))
		})
	}
}

// TestBrokenFixtures holds each broken fixture under testdata to failing the suite on exactly
// the check that names what is wrong with it, with a message that says so in a sentence (no
// gomega dump), and every check after it marked not run (the kill check excepted: it still
// runs, unless the host could not talk to the plugin at all).
func TestBrokenFixtures(t *testing.T) {
	if *pluginPath != "" {
		t.Skip("-plugin given: only that plugin is checked")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tc := range []struct {
		fixture string
		check   string
		says    string
	}{
		{"hang", conformance.CheckRetryScheduleBounds, "did not answer within 2s"},
		{"crash", conformance.CheckRetryScheduleBounds, "the plugin process exited during the call"},
		{"negative-delay", conformance.CheckRetryScheduleBounds, "the delay must be positive"},
		{"exceeds-max", conformance.CheckRetryScheduleBounds, "exceeds the max_delay"},
		{"shrinks", conformance.CheckRetryFloor, "shrank below the policy's floor"},
		{"wrong-cookie", conformance.CheckHandshake, "magic cookie"},
		{"panic-on-empty", conformance.CheckRetryEmptyInput, "the plugin panicked"},
		{"ignores-shutdown", conformance.CheckKill, "did not exit when asked"},
		{"leaves-child", conformance.CheckKill, "still run 2s after Kill"},
		{"no-mtls", conformance.CheckHandshake, "the plugin serves plaintext gRPC on unix "},
		{"exceeds-host-max", conformance.CheckRetryHostBounds, "delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay), the request's max_delay"},
		{"never-gives-up", conformance.CheckRetryGiveUp, "did not give up in 100 rounds"},
		{"zone-dependent", conformance.CheckOwnerZoneIndependent, "answered zone zone-2 otherwise than zone zone-1"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			g := NewWithT(t)
			report := verify(t, conformance.Options{Path: testbin.Build(t, "./shared/conformance/testdata/"+tc.fixture)})
			g.Expect(report.Passed()).To(BeFalse())
			g.Expect(report.Err()).To(MatchError(ContainSubstring(tc.check)))
			failed := report.Failed()
			g.Expect(failed).NotTo(BeEmpty())
			g.Expect(failed[0].Name).To(Equal(tc.check), "the first failed check")
			g.Expect(failed[0].NotRun).To(BeFalse())
			g.Expect(failed[0].Detail).To(ContainSubstring(tc.says))
			g.Expect(failed[0].Detail).NotTo(Or(ContainSubstring("Expected\n"), ContainSubstring("<conformance.")), "a sentence, not a gomega dump")
			for _, c := range failed[1:] {
				g.Expect(c.NotRun).To(BeTrue(), "one fault is one failed check: %s failed too: %s", c.Name, c.Detail)
				g.Expect(c.Detail).To(ContainSubstring(tc.check), "a check that could not run names the check where the plugin broke")
			}
		})
	}
}

// TestAPluginIsHeldToTheRequestsMaxDelay: a host run with a --retry-max-delay under the policy's
// own maximum (the reference exponential policy's 30s) tells the plugin in every request, and a
// plugin that caps its delays there passes; one that does not (exceeds-host-max, in
// TestBrokenFixtures) fails host-bounds.
func TestAPluginIsHeldToTheRequestsMaxDelay(t *testing.T) {
	if *pluginPath != "" {
		t.Skip("-plugin given: only that plugin is checked")
	}
	g := NewWithT(t)
	report := verify(t, conformance.Options{Path: testbin.Build(t, "./plugins/retry-forcer"), Bounds: shared.Bounds{MaxDelay: 50 * time.Millisecond}})
	g.Expect(report.Failed()).To(BeEmpty())
	c, _ := report.Check(conformance.CheckRetryHostBounds)
	g.Expect(c.Detail).To(ContainSubstring("delay at most 50ms (the policy's own max_delay 30s is over it: capped at the request's max_delay)"))
}

// TestAPluginTheHostCannotTalkTo: a plugin that answers the handshake in plaintext fails the
// handshake check with one message that says to implement AutoMTLS and where it is specified,
// and nothing else is run against it.
func TestAPluginTheHostCannotTalkTo(t *testing.T) {
	if *pluginPath != "" {
		t.Skip("-plugin given: only that plugin is checked")
	}
	g := NewWithT(t)
	report := verify(t, conformance.Options{Path: testbin.Build(t, "./shared/conformance/testdata/no-mtls")})
	g.Expect(report.Err()).To(MatchError(HavePrefix("1 of 4 checks failed: handshake")))
	hs, _ := report.Check(conformance.CheckHandshake)
	g.Expect(hs.Detail).To(And(ContainSubstring("Implement AutoMTLS"), ContainSubstring("PLUGIN_CLIENT_CERT"),
		ContainSubstring("docs/plugin-protocol.md#automtls")))
	g.Expect(strings.Count(hs.Detail, "\n")).To(BeZero(), "one message")
	for _, c := range report.Checks[1:] {
		g.Expect(c.NotRun).To(BeTrue(), "%s ran against a plugin the host cannot talk to", c.Name)
	}
}

// TestTheGiveUpCheckAsksForItsDocumentByName: whatever way the derived give-up document fails,
// the report names --give-up-config.
func TestTheGiveUpCheckAsksForItsDocumentByName(t *testing.T) {
	if *pluginPath != "" {
		t.Skip("-plugin given: only that plugin is checked")
	}
	g := NewWithT(t)
	bin := testbin.Build(t, "./shared/conformance/testdata/never-gives-up")
	report := verify(t, conformance.Options{Path: bin})
	c, _ := report.Check(conformance.CheckRetryGiveUp)
	g.Expect(c.Failed()).To(BeTrue())
	g.Expect(c.Detail).To(ContainSubstring("--give-up-config FILE"))

	// With a document of its own it is checked under that document, and fails for what it is.
	report = verify(t, conformance.Options{Path: bin, GiveUpConfig: []byte("delay: 100ms\nmaxAttempts: 2\n")})
	c, _ = report.Check(conformance.CheckRetryGiveUp)
	g.Expect(c.Detail).To(ContainSubstring("under the document given with --give-up-config the plugin did not give up"))
}

func TestReportWrite(t *testing.T) {
	g := NewWithT(t)
	r := conformance.Report{Plugin: "/bin/p", Name: "p", Version: "1", Kinds: []string{conformance.KindRetryForcer}, Checks: []conformance.CheckResult{
		{Name: "handshake", Summary: "starts", Passed: true, Detail: "pid 1"},
		{Name: "retry-forcer/give-up", Summary: "gives up", Skipped: true, Detail: "no document"},
		{Name: "retry-forcer/schedule-bounds", Summary: "bounds", Detail: "round 2: the delay must be positive\nExpected -20ms"},
		{Name: "kill", Summary: "exits", NotRun: true, Detail: "the plugin process exited during retry-forcer/schedule-bounds"},
	}}
	var b strings.Builder
	g.Expect(r.Write(&b)).To(Succeed())
	g.Expect(b.String()).To(And(
		ContainSubstring("p 1, serves RetryForcer"),
		ContainSubstring("✓ handshake"),
		ContainSubstring("    pid 1\n"),
		ContainSubstring("- retry-forcer/give-up"),
		ContainSubstring("    skipped: no document\n"),
		ContainSubstring("✗ retry-forcer/schedule-bounds"),
		ContainSubstring("    round 2: the delay must be positive\n    Expected -20ms\n"),
		ContainSubstring("· kill"),
		ContainSubstring("    not run: the plugin process exited"),
		ContainSubstring("FAIL: 4 checks, 1 passed, 1 failed, 1 not run, 1 skipped"),
	))
	g.Expect(r.Passed()).To(BeFalse())
	g.Expect(r.Err()).To(MatchError("1 of 4 checks failed: retry-forcer/schedule-bounds; 1 more could not run"))
}

func TestMissingBinary(t *testing.T) {
	g := NewWithT(t)
	report := conformance.Run(context.Background(), conformance.Options{Path: "/nonexistent/plugin"})
	g.Expect(report.Passed()).To(BeFalse())
	c, ok := report.Check(conformance.CheckHandshake)
	g.Expect(ok).To(BeTrue())
	g.Expect(c.Detail).To(ContainSubstring("no such file"))
}

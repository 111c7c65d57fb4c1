package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/internal/testbin"
)

// The plugin protocol end to end, with real processes: the Node.js example plugin under
// `kds-host plugin verify` and in a host, a plugin whose decisions are outside the host's
// bounds, and a NACK message far over gRPC's 4 MB default on its way to a plugin.

// metric reads one sample of the Prometheus text format: name with exactly these labels
// (`zone="zone-1"`, or empty), or -1 when there is none.
func metric(text, name, labels string) float64 {
	series := name
	if labels != "" {
		series += "{" + labels + "}"
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func (h *hostProcess) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + h.diag + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// putMesh creates Mesh "default" on the host's global.
func (h *hostProcess) putMesh(t *testing.T) {
	t.Helper()
	meshKind, _ := resource.Default().Get("Mesh")
	if _, _, err := h.api.Put(context.Background(), meshKind, "", "default", []byte(`{"type":"Mesh","name":"default"}`)); err != nil {
		t.Fatal(err)
	}
}

func TestTheNodePluginPassesVerifyWithNothingSkipped(t *testing.T) {
	g := NewWithT(t)
	res := runCLI(t, "", "plugin", "verify", testbin.NodePlugin(t))
	g.Expect(res.err).NotTo(HaveOccurred(), res.stdout)
	g.Expect(res.stdout).To(ContainSubstring("node-retry 1.0.0, serves RetryForcer"))
	g.Expect(res.stdout).To(MatchRegexp(`protocol 1 over gRPC, AutoMTLS \(TLS 1\.[23], the plugin's certificate for localhost, RSA\)`))
	g.Expect(res.stdout).To(ContainSubstring("with maxAttempts: 3 it gave up at round 3"))
	g.Expect(res.stdout).To(ContainSubstring("PASS: 16 checks, 16 passed, 0 failed, 0 not run, 0 skipped"))
}

// TestTheNodePluginDecidesTheHostsRounds loads the Node.js example in a host with --plugin and
// reads the metrics: every round waited the plugin's delay, and none was the fallback's.
func TestTheNodePluginDecidesTheHostsRounds(t *testing.T) {
	g := NewWithT(t)
	policy := writeFile(t, "node.yaml", "delay: 150ms\nmaxAttempts: 0\n")
	// A generous policy deadline: on a loaded machine a decision must not fall back by accident.
	h := startHost(t, "--plugin", testbin.NodePlugin(t), "--plugin-config", "node-retry="+policy, "--policy-timeout", "2s")
	p := pluginNamed(h.plugins(t), "node-retry")
	g.Expect(p.State).To(Equal("running"))
	g.Expect(p.Policy).To(Equal("fixed 150ms, maxAttempts 0"))
	startRejectingZone(t, h)
	h.putMesh(t)

	g.Eventually(func() float64 { return metric(h.metrics(t), "kds_retry_rounds_total", `zone="zone-1"`) }, time.Minute, 20*time.Millisecond).
		Should(BeNumerically(">=", 3))
	m := h.metrics(t)
	rounds := metric(m, "kds_retry_rounds_total", `zone="zone-1"`)
	count, sum := metric(m, "kds_retry_delay_seconds_count", ""), metric(m, "kds_retry_delay_seconds_sum", "")
	g.Expect(count).To(Equal(rounds), "one zone: every round observed once")
	g.Expect(sum).To(BeNumerically("~", 0.15*count, 1e-9), "every round waited the plugin's 150ms")
	g.Expect(metric(m, "kds_retry_delay_seconds_bucket", `le="0.08"`)).To(BeZero())
	g.Expect(metric(m, "kds_retry_delay_seconds_bucket", `le="0.16"`)).To(Equal(count))
	g.Expect(metric(m, "kds_retry_policy_fallbacks_total", `zone="zone-1"`)).To(BeZero())
	g.Expect(pluginNamed(h.plugins(t), "node-retry").Errors).To(BeZero())
	g.Expect(h.zone(t).Retry.Reason).To(Equal("fixed 150ms"))
	g.Expect(h.out.String()).To(ContainSubstring("kds-host.plugin.plugin.js: policy configured"), "its hclog JSON lines reach the host's log")
	g.Expect(h.out.String()).To(MatchRegexp(`\[DEBUG\] kds-host\.retry: retry decision: zone=zone-1 round=1 delay=150ms .*reason="fixed 150ms"`), "a DEBUG line per decision")
}

// TestAGiveUpShowsItsReason: the policy's reason for giving up is in the INFO line and in
// inspect zones.
func TestAGiveUpShowsItsReason(t *testing.T) {
	g := NewWithT(t)
	policy := writeFile(t, "give-up.yaml", "delay: 100ms\nmaxAttempts: 2\n")
	h := startHost(t, "--plugin", buildExample(t), "--plugin-config", "fixed-retry="+policy, "--policy-timeout", "2s")
	startRejectingZone(t, h)
	h.putMesh(t)
	g.Eventually(func() string {
		if r := h.zone(t).Retry; r != nil {
			return r.GivenUp
		}
		return ""
	}, time.Minute, 20*time.Millisecond).Should(Equal("max attempts reached"))
	// The state is set before the line is logged, and the log comes through a pipe.
	g.Eventually(h.out.String, 10*time.Second, 20*time.Millisecond).Should(MatchRegexp(`\[INFO\]  kds-host\.retry: the retry policy gave up: .* zone=zone-1 reason="max attempts reached"`))
	res := runCLI(t, "", "inspect", "zones", "--cp", "http://"+h.apiAddr, "--data-dir", h.dataDir)
	g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
	g.Expect(res.stdout).To(MatchRegexp(`(?m)^zone-1 \(connected\) +Mesh .* 2 +given up +max attempts reached$`))
}

// TestADecisionOverTheHostsBoundIsRefused: a plugin that answers 2h (the host's bound is 1h)
// has every decision refused: a WARN line names the field and its value, the refusal is an
// error of the plugin that inspect plugins shows, and the built-in policy decides.
func TestADecisionOverTheHostsBoundIsRefused(t *testing.T) {
	g := NewWithT(t)
	h := startHost(t, "--plugin", testbin.Build(t, "./shared/conformance/testdata/exceeds-host-max"), "--policy-timeout", "2s")
	startRejectingZone(t, h)
	h.putMesh(t)

	g.Eventually(func() float64 { return metric(h.metrics(t), "kds_retry_policy_fallbacks_total", `zone="zone-1"`) }, time.Minute, 20*time.Millisecond).
		Should(BeNumerically(">=", 2))
	g.Expect(h.out.String()).To(MatchRegexp(`\[WARN\] +kds-host\.plugin: plugin answer refused: .* plugin=exceeds-host-max method=Schedule field=delay value=2h0m0s`))
	p := pluginNamed(h.plugins(t), "exceeds-host-max")
	g.Expect(p.Errors).To(BeNumerically(">=", 2))
	g.Expect(p.State).To(Equal("running"))
	g.Expect(h.zone(t).Retry.Reason).To(HavePrefix("built-in fallback (the host refuses this schedule: delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay)): "))
	// No round waited 2h: the built-in policy's delays are seconds at most. One scrape for both
	// figures: a round may fire between two.
	scrape := h.metrics(t)
	g.Expect(metric(scrape, "kds_retry_delay_seconds_bucket", `le="40.96"`)).To(Equal(metric(scrape, "kds_retry_delay_seconds_count", "")))

	res := runCLI(t, "", "inspect", "plugins", "--cp", "http://"+h.apiAddr, "--data-dir", h.dataDir)
	g.Expect(res.err).NotTo(HaveOccurred(), res.stderr)
	g.Expect(res.stdout).To(MatchRegexp(`(?m)^exceeds-host-max: last error \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\): Schedule: the host refuses this schedule: delay 2h0m0s is over the host's maximum of 1h0m0s \(--retry-max-delay\)$`))

	// A host started with a longer bound applies the same decision.
	h = startHost(t, "--plugin", testbin.Build(t, "./shared/conformance/testdata/exceeds-host-max"), "--policy-timeout", "2s", "--retry-max-delay", "3h")
	startRejectingZone(t, h)
	h.putMesh(t)
	g.Eventually(func() *time.Time {
		if r := h.zone(t).Retry; r != nil {
			return r.NextRetry
		}
		return nil
	}, time.Minute, 20*time.Millisecond).ShouldNot(BeNil())
	g.Expect(h.zone(t).Retry.Reason).To(Equal("two hours"))
	g.Expect(pluginNamed(h.plugins(t), "exceeds-host-max").Errors).To(BeZero())
}

// TestATenMegabyteNACKReachesThePluginTruncated: a zone's NACK message of 10 MB (gRPC's default
// limit is 4 MB) arrives at the plugin's Schedule cut to --max-nack-message bytes (4 KiB) and
// marked, and the plugin, not the fallback, decides.
func TestATenMegabyteNACKReachesThePluginTruncated(t *testing.T) {
	g := NewWithT(t)
	record := filepath.Join(t.TempDir(), "calls.jsonl")
	h := startHostEnv(t, []string{"RECORD_FILE=" + record}, "--kds-auth", "none", "--plugin-env", "RECORD_FILE",
		"--plugin", testbin.Build(t, "./policy/testdata/recorder"), "--policy-timeout", "2s")
	h.putMesh(t)

	conn, err := grpc.NewClient(h.kdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(stream.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "zone-1"}, TypeUrl: "Mesh"})).To(Succeed())
	resp, err := stream.Recv()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetResources()).NotTo(BeEmpty())
	huge := strings.Repeat("admission webhook says no. ", 10<<20/27+1)
	g.Expect(len(huge)).To(BeNumerically(">", 10<<20))
	g.Expect(stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: "Mesh", ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: huge}})).To(Succeed())

	type call struct {
		Zone    string
		Failing []struct {
			Kind        string
			Names       []string
			ErrorDetail string
		}
	}
	var first call
	g.Eventually(func() error {
		b, err := os.ReadFile(record)
		if err != nil {
			return err
		}
		line, _, _ := strings.Cut(string(b), "\n")
		return json.Unmarshal([]byte(line), &first)
	}, time.Minute, 20*time.Millisecond).Should(Succeed())
	g.Expect(first.Zone).To(Equal("zone-1"))
	g.Expect(first.Failing).To(HaveLen(1))
	f := first.Failing[0]
	g.Expect(f.Kind).To(Equal("Mesh"))
	g.Expect(f.Names).To(Equal([]string{"default"}))
	g.Expect(len(f.ErrorDetail)).To(BeNumerically("<=", 4096), "cut to --max-nack-message")
	g.Expect(f.ErrorDetail).To(HavePrefix("admission webhook says no. admission"))
	g.Expect(f.ErrorDetail).To(HaveSuffix("... (truncated)"))
	g.Expect(metric(h.metrics(t), "kds_retry_policy_fallbacks_total", `zone="zone-1"`)).To(BeZero())
	g.Expect(pluginNamed(h.plugins(t), "recorder").Errors).To(BeZero())
}

// Package repro_test runs the two-control-plane reproduction (two-cp.sh) with the real
// binaries, in the old blocking mode and in kds-host's own modes, and checks the story it tells.
package repro_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

type result struct {
	converged   bool
	seconds     float64
	nacks       int
	policyNACKs int
	rounds      int
	output      string
}

// run runs two-cp.sh, on free ports, and parses its RESULT line.
func run(t *testing.T, args ...string) result {
	t.Helper()
	ports := testbin.FreePortBase(t, 0, 1, 5, 100, 101) // two-cp.sh's ports
	bin := filepath.Dir(testbin.Build(t, "./host/cmd/kds-host"))
	testbin.Build(t, "./plugins/retry-forcer")
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(args, "--outage") {
		args = append([]string{"--outage", "2s"}, args...)
	}
	args = append([]string{"--no-build", "--timeout", "60", "--port-base", strconv.Itoa(ports)}, args...)
	cmd := exec.Command(filepath.Join(root, "examples/repro/two-cp.sh"), args...)
	cmd.Env = append(os.Environ(), "KDS_BIN="+bin)
	out, err := cmd.CombinedOutput()
	r := result{output: string(out)}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "RESULT ") {
			continue
		}
		for _, f := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "converged":
				r.converged = v == "yes"
			case "seconds":
				r.seconds, _ = strconv.ParseFloat(v, 64)
			case "nacks":
				r.nacks, _ = strconv.Atoi(v)
			case "policy_nacks":
				r.policyNACKs, _ = strconv.Atoi(v)
			case "rounds":
				r.rounds, _ = strconv.Atoi(v)
			}
		}
	}
	if err != nil || !r.converged {
		t.Fatalf("two-cp.sh %v: %v\n%s", args, err, out)
	}
	return r
}

func TestTheReproductionTellsTheStory(t *testing.T) {
	g := NewWithT(t)
	// Exponential backoff without jitter, so "one backoff round" is known: rounds of 0.1, 0.2,
	// 0.4 and 0.8 s fall within the 2 s outage, and the round of 1.6 s fires after it.
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	g.Expect(os.WriteFile(policy, []byte("policy: exponential\nbase: 100ms\nfactor: 2\nmax: 30s\njitter: none\n"), 0o644)).To(Succeed())
	const outage, round = 2 * time.Second, 1600 * time.Millisecond

	timeline := filepath.Join(t.TempDir(), "async.timeline")
	async := run(t, "--global-flag", "--plugin-config=builtin="+policy, "--timeline", timeline)
	t.Logf("async: %.2fs, %d NACKs, %d rounds", async.seconds, async.nacks, async.rounds)
	samples, err := os.ReadFile(timeline)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(samples)).To(HavePrefix("# label="), "the timeline compare.sh draws")
	g.Expect(string(samples)).To(MatchRegexp(`(?m)^t=[0-9.]+ event=applied$`))
	g.Expect(string(samples)).To(MatchRegexp(`(?m)^t=[0-9.]+ timeouts=3 nacks=[1-9][0-9]* rounds=[1-9]`))
	g.Expect(async.seconds).To(BeNumerically("<=", (outage+round+time.Second).Seconds()), async.output)
	g.Expect(async.rounds).To(BeNumerically(">=", 1))

	blocking := run(t, "--emulate", "blocking-per-type") // 5 s, as Kuma slept
	t.Logf("blocking-per-type: %.2fs, %d NACKs", blocking.seconds, blocking.nacks)
	g.Expect(blocking.seconds).To(BeNumerically(">", async.seconds), "blocking per type is the slowest")

	perStream := run(t, "--emulate", "blocking-per-stream")
	t.Logf("blocking-per-stream: %.2fs, %d NACKs", perStream.seconds, perStream.nacks)
	g.Expect(blocking.seconds).To(BeNumerically(">=", perStream.seconds-0.5), "blocking per type is never faster than per stream (both sleep whole backoffs)")

	owner := run(t, "--owner-holds", "--global-flag", "--plugin-config=builtin="+policy)
	t.Logf("owner-check: %.2fs, %d NACKs, %d of policies", owner.seconds, owner.nacks, owner.policyNACKs)
	g.Expect(owner.policyNACKs).To(BeZero(), "with owner-check the policies are withheld, never NACKed\n%s", owner.output)
	g.Expect(owner.nacks).To(BeNumerically(">=", 1), "Mesh itself is still refused during the outage")
	g.Expect(async.policyNACKs).To(BeNumerically(">=", 1), "without it, the policies are refused")

	// A plain xDS zone (Kuma's own) says nothing of causes and never asks again: the global's
	// timer alone brings it back.
	plain := run(t, "--zone-flag", "--plain-xds", "--global-flag", "--plugin-config=builtin="+policy)
	t.Logf("plain xDS zone: %.2fs, %d NACKs, %d rounds", plain.seconds, plain.nacks, plain.rounds)
	g.Expect(plain.rounds).To(BeNumerically(">=", 1), "the timer did it")

	// Scenario B: three policy kinds keep failing; a valid MeshTimeout must not wait behind them.
	failing := []string{"--outage", "MeshRetry=60s", "--outage", "MeshCircuitBreaker=60s", "--outage", "MeshHealthCheck=60s",
		"--apply", "examples/resources/meshhealthcheck.yaml"}
	healthy := run(t, failing...)
	stalled := run(t, append(failing, "--emulate", "blocking-per-type")...)
	t.Logf("valid update with 3 kinds failing: async %.2fs, blocking-per-type %.2fs", healthy.seconds, stalled.seconds)
	g.Expect(healthy.policyNACKs).To(BeNumerically(">=", 3), "the failing kinds were refused meanwhile")
	g.Expect(stalled.seconds).To(BeNumerically(">", healthy.seconds+1), "the old code made the valid update wait for a sleep")
}

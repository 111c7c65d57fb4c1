package policy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared"
)

// TestADecisionOutsideTheHostsBoundsIsAnErrorOfThePlugin: a plugin that answers a 2h delay
// (the host's bound is 1h) has its answer refused, and the refusal is counted against it, kept
// as its last error and logged at WARN with the field and its value.
func TestADecisionOutsideTheHostsBoundsIsAnErrorOfThePlugin(t *testing.T) {
	g := NewWithT(t)
	var log syncBuffer
	cfg := config(policy.Spec{Path: testbin.Build(t, "./shared/conformance/testdata/exceeds-host-max")})
	cfg.Logger = hostLogger(&hclog.LoggerOptions{Name: "kds-host", Level: hclog.Warn, Output: &log})
	rt := start(t, cfg)

	_, err := schedule(rt)
	g.Expect(errors.As(err, new(*shared.BoundsError))).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError("the host refuses this schedule: delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay)"))
	st := statusOf(rt, "exceeds-host-max")
	g.Expect(st.Calls).To(BeEquivalentTo(1))
	g.Expect(st.Errors).To(BeEquivalentTo(1))
	g.Expect(st.State).To(Equal(policy.StateRunning), "a refused answer is no reason to restart the plugin")
	g.Expect(st.LastError).To(Equal("Schedule: the host refuses this schedule: delay 2h0m0s is over the host's maximum of 1h0m0s (--retry-max-delay)"))
	g.Expect(st.LastErrorAt).NotTo(BeNil())
	g.Expect(log.String()).To(MatchRegexp(`\[WARN\]  kds-host\.plugin: plugin answer refused: .* plugin=exceeds-host-max method=Schedule field=delay value=2h0m0s limit=.*1h0m0s`))

	// A host with a longer bound takes the same answer.
	cfg.Bounds = shared.Bounds{MaxDelay: 3 * time.Hour}
	rt = start(t, cfg)
	d, err := schedule(rt)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(Equal(2 * time.Hour))
	g.Expect(statusOf(rt, "exceeds-host-max").LastError).To(BeEmpty())
}

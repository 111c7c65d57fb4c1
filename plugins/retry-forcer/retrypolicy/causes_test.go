package retrypolicy_test

import (
	"math/rand/v2"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// name is one rejected name with its cause.
type name struct {
	kind, name string
	cause      kdsv1.Cause
	attempts   uint32
}

func withCauses(names ...name) []*pluginv1.FailingKind {
	byKind := map[string]*pluginv1.FailingKind{}
	var out []*pluginv1.FailingKind
	for _, n := range names {
		fk := byKind[n.kind]
		if fk == nil {
			fk = &pluginv1.FailingKind{Kind: n.kind, NackCount: 1}
			byKind[n.kind] = fk
			out = append(out, fk)
		}
		fk.RejectedNames = append(fk.RejectedNames, n.name)
		rn := &pluginv1.RejectedName{Name: n.name, Cause: n.cause, Attempts: max(n.attempts, 1)}
		if n.cause == kdsv1.Cause_CAUSE_MISSING_OWNER {
			rn.MissingOwner = &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}
		}
		fk.Rejected = append(fk.Rejected, rn)
	}
	return out
}

// inARow sets every rejected name's cause_attempts, as a host that counts them does.
func inARow(n uint32, failing []*pluginv1.FailingKind) []*pluginv1.FailingKind {
	for _, fk := range failing {
		for _, rn := range fk.Rejected {
			rn.CauseAttempts = n
		}
	}
	return failing
}

func TestTheReferencePolicyUsesTheZonesCauses(t *testing.T) {
	const (
		transient = kdsv1.Cause_CAUSE_TRANSIENT
		owner     = kdsv1.Cause_CAUSE_MISSING_OWNER
		invalid   = kdsv1.Cause_CAUSE_INVALID
		none      = kdsv1.Cause_CAUSE_UNSPECIFIED
	)
	for _, tc := range []struct {
		name     string
		doc      string
		round    uint32
		failing  []*pluginv1.FailingKind
		minDelay time.Duration
		maxDelay time.Duration
		kinds    []string
		hold     []string
		hostMax  time.Duration // the request's max_delay
	}{
		{name: "without causes: the policy as it is", doc: "jitter: none", round: 10,
			failing: failing("Mesh"), minDelay: 30 * time.Second, maxDelay: 30 * time.Second, kinds: []string{"Mesh"}},
		{name: "unspecified causes: the policy as it is", doc: "jitter: none", round: 10,
			failing: withCauses(name{"Mesh", "default", none, 1}), minDelay: 30 * time.Second, maxDelay: 30 * time.Second, kinds: []string{"Mesh"}},
		{name: "TRANSIENT: capped at transientMax, drawn in its upper half", doc: "jitter: none", round: 10,
			failing: withCauses(name{"Mesh", "default", transient, 1}), minDelay: time.Second, maxDelay: 2 * time.Second, kinds: []string{"Mesh"}},
		{name: "TRANSIENT in an early round: the policy's own, shorter delay", doc: "jitter: none", round: 0,
			failing: withCauses(name{"Mesh", "default", transient, 1}), minDelay: 100 * time.Millisecond, maxDelay: 100 * time.Millisecond, kinds: []string{"Mesh"}},
		{name: "TRANSIENT with another cap", doc: "jitter: none\ntransientMax: 500ms", round: 10,
			failing: withCauses(name{"Mesh", "default", transient, 1}), minDelay: 250 * time.Millisecond, maxDelay: 500 * time.Millisecond, kinds: []string{"Mesh"}},
		{name: "TRANSIENT never under a fixed policy's floor", doc: "policy: fixed\ndelay: 5s", round: 3,
			failing: withCauses(name{"Mesh", "default", transient, 1}), minDelay: 5 * time.Second, maxDelay: 5 * time.Second, kinds: []string{"Mesh"}},
		{name: "MISSING_OWNER alone: the slow safety net", doc: "jitter: none", round: 0,
			failing: withCauses(name{"MeshTimeout", "default/a", owner, 1}), minDelay: 30 * time.Second, maxDelay: 30 * time.Second, kinds: []string{"MeshTimeout"}},
		{name: "MISSING_OWNER waits no longer than the policy's max", doc: "policy: fixed\ndelay: 2s", round: 0,
			failing: withCauses(name{"MeshTimeout", "default/a", owner, 1}), minDelay: 2 * time.Second, maxDelay: 2 * time.Second, kinds: []string{"MeshTimeout"}},
		{name: "a transient owner and its waiting policies: the owner's pace, every kind resent", doc: "jitter: none", round: 10,
			failing:  withCauses(name{"Mesh", "default", transient, 1}, name{"MeshTimeout", "default/a", owner, 1}),
			minDelay: time.Second, maxDelay: 2 * time.Second, kinds: []string{"Mesh", "MeshTimeout"}},
		{name: "INVALID before its attempts: resent at the policy's pace", doc: "jitter: none", round: 1,
			failing: withCauses(name{"MeshTimeout", "default/bad", invalid, 2}), minDelay: 200 * time.Millisecond, maxDelay: 200 * time.Millisecond, kinds: []string{"MeshTimeout"}},
		{name: "INVALID at its attempts: parked, the rest goes on", doc: "jitter: none", round: 2,
			failing:  withCauses(name{"MeshTimeout", "default/bad", invalid, 3}, name{"MeshTimeout", "default/ok", transient, 1}, name{"MeshRetry", "default/r", invalid, 3}),
			minDelay: 400 * time.Millisecond, maxDelay: 400 * time.Millisecond, kinds: []string{"MeshTimeout"}, hold: []string{"MeshTimeout/default/bad", "MeshRetry/default/r"}},
		{name: "INVALID attempts are configurable; everything parked needs no delay", doc: "jitter: none\ninvalidAttempts: 1", round: 0,
			failing: withCauses(name{"MeshTimeout", "default/bad", invalid, 1}), hold: []string{"MeshTimeout/default/bad"}},
		// Issue 25: 12 TRANSIENT NACKs and then one INVALID arrive as attempts 13; the INVALID
		// threshold counts the INVALID ones in a row (cause_attempts), not the others.
		{name: "INVALID after TRANSIENT ones: only the INVALID NACKs in a row count", doc: "jitter: none", round: 1,
			failing: inARow(1, withCauses(name{"MeshTimeout", "default/bad", invalid, 13})), minDelay: 200 * time.Millisecond, maxDelay: 200 * time.Millisecond, kinds: []string{"MeshTimeout"}},
		{name: "INVALID in a row at its attempts: parked", doc: "jitter: none", round: 1,
			failing: inARow(3, withCauses(name{"MeshTimeout", "default/bad", invalid, 15})), hold: []string{"MeshTimeout/default/bad"}},
		{name: "capped at the host's max_delay", doc: "jitter: none", round: 10,
			failing: failing("Mesh"), hostMax: 5 * time.Second, minDelay: 5 * time.Second, maxDelay: 5 * time.Second, kinds: []string{"Mesh"}},
		{name: "a host's max_delay over the policy's changes nothing", doc: "jitter: none", round: 10,
			failing: failing("Mesh"), hostMax: time.Hour, minDelay: 30 * time.Second, maxDelay: 30 * time.Second, kinds: []string{"Mesh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			f := retrypolicy.New(retrypolicy.WithRand(rand.New(rand.NewPCG(1, 2))))
			configure(t, f, tc.doc)
			for range 50 { // the jittered cases, many draws
				req := &pluginv1.ScheduleRequest{Zone: "zone-1", Round: tc.round, Failing: tc.failing}
				if tc.hostMax > 0 {
					req.MaxDelay = durationpb.New(tc.hostMax)
				}
				resp, err := f.Schedule(t.Context(), req)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(resp.GetGiveUp()).To(BeFalse())
				if tc.kinds == nil {
					g.Expect(resp.GetDelay()).To(BeNil(), "nothing left to resend: no delay")
				}
				if tc.hostMax > 0 && tc.hostMax < 30*time.Second {
					g.Expect(resp.GetReason()).To(ContainSubstring("capped at the host's max_delay " + tc.hostMax.String()))
				}
				d := resp.GetDelay().AsDuration()
				g.Expect(d).To(BeNumerically(">=", tc.minDelay))
				g.Expect(d).To(BeNumerically("<=", tc.maxDelay))
				g.Expect(resp.GetKinds()).To(Equal(tc.kinds))
				var held []string
				for _, h := range resp.GetHold() {
					held = append(held, h.GetKind()+"/"+h.GetName())
					g.Expect(h.GetReason()).To(ContainSubstring("invalid"))
				}
				g.Expect(held).To(ConsistOf(tc.hold))
			}
		})
	}
}

func TestTheReferencePolicyRefusesABadMaxDelay(t *testing.T) {
	g := NewWithT(t)
	f := retrypolicy.New()
	for _, d := range []*durationpb.Duration{durationpb.New(-time.Second), {Seconds: 1, Nanos: -1}} {
		_, err := f.Schedule(t.Context(), &pluginv1.ScheduleRequest{Zone: "zone-1", Failing: failing("Mesh"), MaxDelay: d})
		g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
		g.Expect(status.Convert(err).Message()).To(HavePrefix("max_delay: "))
	}
}

package retry_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// The Machine's transitions, one step at a time: no goroutine, no timer, no clock.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one event for the Machine and what it must answer.
type step struct {
	name string
	// do feeds one event; token is the token of the last Ask or Arm.
	do   func(m *retry.Machine, token uint64, now time.Time) retry.Ready
	want func(g Gomega, r retry.Ready, st retry.StreamState)
}

func nackAt(typeURL string, names ...string) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
		return m.NACK(nack(typeURL, names...), now)
	}
}

func nackCause(typeURL, name string, cause event.Cause, owner string) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
		return m.NACK(event.NACK{StreamID: 1, Node: "node-1", TypeURL: typeURL, Detail: "rejected",
			Rejected: []event.Rejection{{Name: name, Version: "v1", Cause: cause, MissingOwner: owner}}}, now)
	}
}

func ackAt(typeURL string, names ...string) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
		v := map[string]string{}
		for _, n := range names {
			v[n] = "v1"
		}
		return m.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: typeURL, Versions: event.VersionsOf(v)}, now)
	}
}

func sentAt(typeURL, name, version string) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
		return m.Sent(event.Sent{StreamID: 1, Node: "node-1", TypeURL: typeURL, Versions: event.VersionsOf(map[string]string{name: version})}, now)
	}
}

func decide(resp *pluginv1.ScheduleResponse, err error) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return func(m *retry.Machine, token uint64, now time.Time) retry.Ready {
		return m.Decided(token, resp, err, now)
	}
}

func delay(d time.Duration, typeURLs ...string) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return decide(&pluginv1.ScheduleResponse{Delay: durationpb.New(d), Kinds: typeURLs}, nil)
}

func giveUp(reason string) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return decide(&pluginv1.ScheduleResponse{GiveUp: true, Reason: reason}, nil)
}

func fire(m *retry.Machine, token uint64, now time.Time) retry.Ready { return m.Fired(token, now) }

func stale(do func(*retry.Machine, uint64, time.Time) retry.Ready) func(*retry.Machine, uint64, time.Time) retry.Ready {
	return func(m *retry.Machine, token uint64, now time.Time) retry.Ready { return do(m, token-1, now) }
}

func asks(round uint32, typeURLs ...string) func(Gomega, retry.Ready, retry.StreamState) {
	return func(g Gomega, r retry.Ready, _ retry.StreamState) {
		g.Expect(r.Ask).NotTo(BeNil(), "an Ask")
		g.Expect(r.Ask.GetRound()).To(Equal(round))
		var got []string
		for _, f := range r.Ask.GetFailing() {
			got = append(got, f.GetKind())
		}
		g.Expect(got).To(Equal(typeURLs))
		g.Expect(r.Arm).To(BeZero())
	}
}

func arms(d time.Duration) func(Gomega, retry.Ready, retry.StreamState) {
	return func(g Gomega, r retry.Ready, st retry.StreamState) {
		g.Expect(r.Arm).To(Equal(d))
		g.Expect(r.Ask).To(BeNil())
		g.Expect(st.NextRetry).NotTo(BeNil())
	}
}

func resends(names map[string][]string, thenAsk bool) func(Gomega, retry.Ready, retry.StreamState) {
	return func(g Gomega, r retry.Ready, _ retry.StreamState) {
		g.Expect(r.Resend).To(Equal(names))
		g.Expect(r.Round).NotTo(BeNil())
		g.Expect(r.Ask != nil).To(Equal(thenAsk), "an Ask after the round")
	}
}

// attempts expects an Ask whose only rejected name has these attempts and cause_attempts.
func attempts(all, cause uint32) func(Gomega, retry.Ready, retry.StreamState) {
	return func(g Gomega, r retry.Ready, _ retry.StreamState) {
		g.Expect(r.Ask).NotTo(BeNil(), "an Ask")
		rn := r.Ask.GetFailing()[0].GetRejected()[0]
		g.Expect([]uint32{rn.GetAttempts(), rn.GetCauseAttempts()}).To(Equal([]uint32{all, cause}), "attempts, cause_attempts")
	}
}

func nothing(g Gomega, r retry.Ready, _ retry.StreamState) {
	g.Expect(r).To(Equal(retry.Ready{Token: r.Token}))
}

func TestMachineTransitions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		end   func(g Gomega, st retry.StreamState)
	}{
		{"a NACK asks, the decision arms, the timer resends", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"decision", delay(time.Second), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}}, false)},
			{"NACK of the resend", nackAt("Mesh", "default"), asks(1, "Mesh")},
		}, func(g Gomega, st retry.StreamState) {
			g.Expect(st.Round).To(Equal(uint32(1)))
			g.Expect(st.LastDelay).To(Equal("1s"))
			g.Expect(st.Failing[0].NACKs).To(Equal(uint32(2)))
		}},
		{"NACKs while a round is pending join it", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"NACK while asking", nackAt("MeshTimeout", "default/a"), nothing},
			{"decision", delay(time.Second), arms(time.Second)},
			{"NACK while armed", nackAt("MeshRetry", "default/r"), nothing},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}, "MeshRetry": {"default/r"}, "MeshTimeout": {"default/a"}}, false)},
		}, nil},
		{"an ACK of every failing type disarms and resets", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"decision", delay(time.Second), arms(time.Second)},
			{"ACK", ackAt("Mesh", "default"), func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(r.Disarm).To(BeTrue())
				g.Expect(st.Failing).To(BeEmpty())
				g.Expect(st.NextRetry).To(BeNil())
			}},
			{"the stale timer", stale(fire), nothing},
		}, func(g Gomega, st retry.StreamState) { g.Expect(st.Round).To(BeZero()) }},
		{"a partial NACK keeps only what was rejected", []step{
			{"NACK", nackAt("MeshTimeout", "default/a", "default/b"), asks(0, "MeshTimeout")},
			{"ACK of one", ackAt("MeshTimeout", "default/a"), nothing},
		}, func(g Gomega, st retry.StreamState) {
			g.Expect(st.Failing[0].Rejected).To(Equal([]string{"default/b"}))
		}},
		{"a type left out of the plan gets its own round after it", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"NACK", nackAt("MeshTimeout", "default/a"), nothing},
			{"decision for Mesh only", delay(time.Second, "Mesh"), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}}, true)},
		}, nil},
		{"a failed decision retries in a second", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"no policy answered", decide(nil, errors.New("down")), arms(time.Second)},
		}, nil},
		{"a stale decision is dropped", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"stale decision", stale(delay(time.Second)), nothing},
		}, nil},
		{"a give-up holds until content changes", []step{
			{"NACK", nackAt("MeshTimeout", "default/a"), asks(0, "MeshTimeout")},
			{"give up", giveUp("max attempts"), func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(r.GaveUp).To(Equal("max attempts"))
				g.Expect(st.GivenUp).To(Equal("max attempts"))
			}},
			{"same content NACKed again", nackAt("MeshTimeout", "default/a"), nothing},
			{"new content sent", sentAt("MeshTimeout", "default/a", "v2"), nothing},
			{"its NACK starts over", nackAt("MeshTimeout", "default/a"), asks(0, "MeshTimeout")},
		}, nil},
		{"a resend of the same version is not new content", []step{
			{"NACK", nackAt("MeshTimeout", "default/a"), asks(0, "MeshTimeout")},
			{"give up", giveUp("no"), func(Gomega, retry.Ready, retry.StreamState) {}},
			{"same version sent", sentAt("MeshTimeout", "default/a", "v1"), nothing},
		}, func(g Gomega, st retry.StreamState) { g.Expect(st.GivenUp).To(Equal("no")) }},
		// Defect 1: the give-up was lifted by new content of one type, that type was ACKed, and
		// the other failing type was left with no round pending.
		{"a give-up lifted by new content reschedules the types still failing", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"NACK", nackAt("MeshTimeout", "default/a"), nothing},
			{"give up", giveUp("max attempts"), func(Gomega, retry.Ready, retry.StreamState) {}},
			{"new MeshTimeout content", sentAt("MeshTimeout", "default/a", "v2"), asks(0, "Mesh")},
			{"its ACK", ackAt("MeshTimeout", "default/a"), nothing},
			{"decision", delay(time.Second), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}}, false)},
		}, nil},
		{"an initial ACK says nothing of this stream's rejections", []step{
			{"NACK", nackAt("Mesh", "default"), asks(0, "Mesh")},
			{"initial ACK", func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
				return m.ACK(event.ACK{StreamID: 1, TypeURL: "Mesh", Versions: event.VersionsOf(map[string]string{"default": "v1"}), Initial: true}, now)
			}, nothing},
		}, func(g Gomega, st retry.StreamState) { g.Expect(st.Failing).To(HaveLen(1)) }},
		{"an owner's ACK resends at once what missed it", []step{
			{"NACK of the Mesh", nackCause("Mesh", "default", event.CauseTransient, ""), asks(0, "Mesh")},
			{"NACK of a policy without it", nackCause("MeshTimeout", "default/a", event.CauseMissingOwner, "Mesh/default"), nothing},
			{"decision", delay(time.Minute), arms(time.Minute)},
			{"the Mesh ACKed", ackAt("Mesh", "default"), func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(r.Resend).To(Equal(map[string][]string{"MeshTimeout": {"default/a"}}))
				g.Expect(r.Released).To(Equal(map[string]int{"MeshTimeout": 1}))
				g.Expect(r.Round).To(BeNil(), "not a round")
			}},
			{"another owner's ACK releases nothing", ackAt("Mesh", "other"), nothing},
		}, nil},
		{"a hold answer parks an INVALID name until its content changes", []step{
			{"NACK", nackCause("MeshTimeout", "default/bad", event.CauseInvalid, ""), asks(0, "MeshTimeout")},
			{"NACK of another", nackCause("MeshTimeout", "default/late", event.CauseMissingOwner, "Mesh/default"), nothing},
			{"decision parks the invalid one", decide(&pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second),
				Hold: []*pluginv1.HeldName{{Kind: "MeshTimeout", Name: "default/bad", Reason: "invalid 3 times"}}}, nil),
				func(g Gomega, r retry.Ready, st retry.StreamState) {
					g.Expect(r.Parked).To(Equal([]retry.ParkedName{{TypeURL: "MeshTimeout", Name: "default/bad", Reason: "invalid 3 times"}}))
					g.Expect(r.Arm).To(Equal(time.Second), "the other name still gets its round")
					g.Expect(st.Failing[0].Rejected).To(Equal([]string{"default/late"}))
					g.Expect(st.Failing[0].Parked).To(Equal([]retry.ParkedName{{TypeURL: "MeshTimeout", Name: "default/bad", Reason: "invalid 3 times"}}))
					js, err := json.Marshal(st.Failing[0])
					g.Expect(err).NotTo(HaveOccurred())
					var fields map[string]json.RawMessage
					g.Expect(json.Unmarshal(js, &fields)).To(Succeed())
					parked := `[{"typeUrl":"MeshTimeout","name":"default/bad","reason":"invalid 3 times"}]`
					g.Expect(fields).To(HaveKeyWithValue("parked", MatchJSON(parked)))
					g.Expect(fields).To(HaveKeyWithValue("typeUrl", MatchJSON(`"MeshTimeout"`)))
				}},
			{"timer", fire, resends(map[string][]string{"MeshTimeout": {"default/late"}}, false)},
			{"the other is ACKed", ackAt("MeshTimeout", "default/late"), func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(st.Failing).To(HaveLen(1), "the parked name is still shown")
				g.Expect(st.Failing[0].Parked).To(HaveLen(1))
				g.Expect(st.Round).To(BeZero(), "nothing left to resend: the stream starts over")
			}},
			{"the parked name NACKed again stays parked", nackCause("MeshTimeout", "default/bad", event.CauseInvalid, ""), nothing},
			{"new content of it is sent", sentAt("MeshTimeout", "default/bad", "v2"), func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(st.Failing).To(BeEmpty(), "released")
			}},
		}, nil},
		{"a policy that parks everything leaves nothing armed", []step{
			{"NACK", nackCause("MeshTimeout", "default/bad", event.CauseInvalid, ""), asks(0, "MeshTimeout")},
			{"decision parks it", decide(&pluginv1.ScheduleResponse{Delay: durationpb.New(time.Second),
				Hold: []*pluginv1.HeldName{{Kind: "MeshTimeout", Name: "default/bad"}}}, nil),
				func(g Gomega, r retry.Ready, st retry.StreamState) {
					g.Expect(r.Arm).To(BeZero())
					g.Expect(st.NextRetry).To(BeNil())
					g.Expect(st.Failing[0].Parked[0].Reason).NotTo(BeEmpty())
				}},
		}, nil},
		{"the request carries each name's cause, owner and attempts", []step{
			{"NACK", nackCause("MeshTimeout", "default/a", event.CauseMissingOwner, "Mesh/default"), asks(0, "MeshTimeout")},
			{"decision", delay(time.Second), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"MeshTimeout": {"default/a"}}, false)},
			{"NACK again", nackCause("MeshTimeout", "default/a", event.CauseMissingOwner, "Mesh/default"), func(g Gomega, r retry.Ready, _ retry.StreamState) {
				f := r.Ask.GetFailing()[0]
				g.Expect(f.GetRejectedNames()).To(Equal([]string{"default/a"}))
				g.Expect(f.GetRejected()).To(HaveLen(1))
				g.Expect(f.GetRejected()[0].GetCause()).To(Equal(kdsv1.Cause_CAUSE_MISSING_OWNER))
				g.Expect(f.GetRejected()[0].GetMissingOwner().GetKind()).To(Equal("Mesh"))
				g.Expect(f.GetRejected()[0].GetMissingOwner().GetName()).To(Equal("default"))
				g.Expect(f.GetRejected()[0].GetAttempts()).To(Equal(uint32(2)))
			}},
		}, nil},
		{"attempts count every NACK of a version, cause_attempts those in a row with its cause", []step{
			{"TRANSIENT", nackCause("Mesh", "default", event.CauseTransient, ""), asks(0, "Mesh")},
			{"decision", delay(time.Second), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}}, false)},
			{"TRANSIENT again", nackCause("Mesh", "default", event.CauseTransient, ""), attempts(2, 2)},
			{"decision", delay(time.Second), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}}, false)},
			{"INVALID now", nackCause("Mesh", "default", event.CauseInvalid, ""), attempts(3, 1)},
			{"decision", delay(time.Second), arms(time.Second)},
			{"timer", fire, resends(map[string][]string{"Mesh": {"default"}}, false)},
			{"INVALID again", nackCause("Mesh", "default", event.CauseInvalid, ""), attempts(4, 2)},
			{"decision", delay(time.Second), arms(time.Second)},
			{"new content sent", sentAt("Mesh", "default", "v2"), func(Gomega, retry.Ready, retry.StreamState) {}},
			{"its NACK starts both over", func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
				return m.NACK(event.NACK{StreamID: 1, Node: "node-1", TypeURL: "Mesh", Detail: "rejected",
					Rejected: []event.Rejection{{Name: "default", Version: "v2", Cause: event.CauseInvalid}}}, now)
			}, attempts(1, 1)},
		}, nil},
		{"an answer that parks every name it was asked about needs no delay", []step{
			{"NACK", nackCause("MeshTimeout", "default/bad", event.CauseInvalid, ""), asks(0, "MeshTimeout")},
			{"NACK while asking", nackCause("MeshRetry", "default/late", event.CauseTransient, ""), nothing},
			{"decision parks the one asked about, no delay", decide(&pluginv1.ScheduleResponse{
				Hold: []*pluginv1.HeldName{{Kind: "MeshTimeout", Name: "default/bad", Reason: "invalid"}}}, nil),
				func(g Gomega, r retry.Ready, st retry.StreamState) {
					g.Expect(r.Parked).To(HaveLen(1))
					g.Expect(r.Arm).To(BeZero(), "no failed-decision round")
					g.Expect(r.Ask).NotTo(BeNil(), "the name rejected meanwhile is asked about at once")
					g.Expect(r.Ask.GetFailing()).To(HaveLen(1))
					g.Expect(r.Ask.GetFailing()[0].GetKind()).To(Equal("MeshRetry"))
					g.Expect(st.Reason).NotTo(ContainSubstring("no policy answered"))
				}},
			{"decision", delay(time.Second), arms(time.Second)},
		}, nil},
		{"an owner's ACK releases a parked name that missed it", []step{
			{"NACK", nackCause("MeshTimeout", "default/a", event.CauseMissingOwner, "Mesh/default"), asks(0, "MeshTimeout")},
			{"decision parks it", decide(&pluginv1.ScheduleResponse{
				Hold: []*pluginv1.HeldName{{Kind: "MeshTimeout", Name: "default/a", Reason: "wait for the Mesh"}}}, nil),
				func(g Gomega, r retry.Ready, st retry.StreamState) {
					g.Expect(r.Arm).To(BeZero())
					g.Expect(st.Failing[0].Parked).To(HaveLen(1))
				}},
			{"the Mesh ACKed", ackAt("Mesh", "default"), func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(r.Resend).To(Equal(map[string][]string{"MeshTimeout": {"default/a"}}))
				g.Expect(r.Released).To(Equal(map[string]int{"MeshTimeout": 1}))
				g.Expect(st.Failing[0].Parked).To(BeEmpty())
				g.Expect(st.Failing[0].Rejected).To(Equal([]string{"default/a"}), "rejected again until the client answers")
				g.Expect(r.Ask).To(BeNil(), "no round until the client answers the resend")
			}},
			{"its NACK asks the policy again", nackCause("MeshTimeout", "default/a", event.CauseMissingOwner, "Mesh/default"), attempts(2, 2)},
		}, nil},
		{"a removed name is nothing to resend", []step{
			{"NACK", nackAt("MeshTimeout", "default/a"), asks(0, "MeshTimeout")},
			{"removal", func(m *retry.Machine, _ uint64, now time.Time) retry.Ready {
				return m.Sent(event.Sent{StreamID: 1, TypeURL: "MeshTimeout", Removed: []string{"default/a"}}, now)
			}, func(g Gomega, r retry.Ready, st retry.StreamState) {
				g.Expect(r.Disarm).To(BeTrue(), "the outstanding decision is dropped")
				g.Expect(st.Failing).To(BeEmpty())
			}},
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			m := retry.NewMachine(1, "node-1")
			var token uint64
			now := t0
			for i, s := range tc.steps {
				now = now.Add(time.Second)
				r := s.do(m, token, now)
				if r.Ask != nil || r.Arm > 0 {
					token = r.Token
				}
				t.Run(fmt.Sprintf("%d %s", i, s.name), func(t *testing.T) { s.want(NewWithT(t), r, m.State()) })
			}
			if tc.end != nil {
				tc.end(g, m.State())
			}
		})
	}
}

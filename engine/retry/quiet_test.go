package retry

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kds-host/kds-host/engine/event"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
)

// A quiet Machine's Sent and ACK change nothing: two Machines fed the same random events, one of
// them skipping every Sent and ACK while it is quiet (as Scheduler.skips does), answer the same
// and show the same state at every step, tokens aside.
func TestAQuietMachineIgnoresSentAndACK(t *testing.T) {
	typeURLs := []string{"Mesh", "MeshTimeout"}
	names := []string{"a", "b", "c"}
	causes := []event.Cause{event.CauseInvalid, event.CauseMissingOwner, event.CauseTransient}
	var skipped, quietSeen int
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 7))
		all, skip := NewMachine(1, "node-1"), NewMachine(1, "node-1")
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for i := range 60 {
			now = now.Add(time.Second)
			typeURL, name := typeURLs[rng.IntN(len(typeURLs))], names[rng.IntN(len(names))]
			version := fmt.Sprint("v", rng.IntN(3))
			var ev func(m *Machine) Ready
			plain := false // a Sent or an ACK
			switch rng.IntN(6) {
			case 0:
				cause := causes[rng.IntN(len(causes))]
				owner := ""
				if cause == event.CauseMissingOwner {
					owner = "Mesh/" + names[rng.IntN(len(names))]
				}
				ev = func(m *Machine) Ready {
					return m.NACK(event.NACK{StreamID: 1, Node: "node-1", TypeURL: typeURL, Detail: "rejected",
						Rejected: []event.Rejection{{Name: name, Version: version, Cause: cause, MissingOwner: owner}}}, now)
				}
			case 1:
				plain = true
				ev = func(m *Machine) Ready {
					return m.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: typeURL, Versions: event.VersionsOf(map[string]string{name: version})}, now)
				}
			case 2:
				plain = true
				removed := rng.IntN(4) == 0
				ev = func(m *Machine) Ready {
					s := event.Sent{StreamID: 1, Node: "node-1", TypeURL: typeURL}
					if removed {
						s.Removed = []string{name}
					} else {
						s.Versions = event.VersionsOf(map[string]string{name: version})
					}
					return m.Sent(s, now)
				}
			case 3:
				var resp *pluginv1.ScheduleResponse
				var err error
				switch rng.IntN(3) {
				case 0:
					resp = &pluginv1.ScheduleResponse{Delay: durationpb.New(time.Duration(1+rng.IntN(5)) * time.Second)}
				case 1:
					resp = &pluginv1.ScheduleResponse{GiveUp: true, Reason: "enough"}
				default:
					err = errors.New("no policy")
				}
				ev = func(m *Machine) Ready { return m.Decided(m.token, resp, err, now) }
			case 4:
				ev = func(m *Machine) Ready { return m.Fired(m.token, now) }
			default:
				ev = func(m *Machine) Ready {
					return m.ACK(event.ACK{StreamID: 1, Node: "node-1", TypeURL: typeURL, Initial: true}, now)
				}
			}
			if all.quiet() != skip.quiet() {
				t.Fatalf("seed %d step %d: quiet %v and %v", seed, i, all.quiet(), skip.quiet())
			}
			ra := ev(all)
			var rs Ready
			if plain && skip.quiet() {
				skipped++
			} else {
				rs = ev(skip)
			}
			if skip.quiet() {
				quietSeen++
			}
			ra.Token, rs.Token = 0, 0
			if !reflect.DeepEqual(ra, rs) {
				t.Fatalf("seed %d step %d: answered %+v, and %+v with quiet events skipped", seed, i, ra, rs)
			}
			if a, s := all.State(), skip.State(); !reflect.DeepEqual(a, s) {
				t.Fatalf("seed %d step %d: state %+v, and %+v with quiet events skipped", seed, i, a, s)
			}
		}
	}
	if skipped == 0 || quietSeen == 0 {
		t.Fatalf("skipped %d events, quiet %d times: the test did not exercise the skip", skipped, quietSeen)
	}
	t.Logf("skipped %d Sent and ACK events of quiet Machines", skipped)
}

package controlplane

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/store"
)

// recorder is a ZoneStreamRecorder that keeps the heartbeats it is given and answers the count
// the test sets (-1 where the store would not count).
type recorder struct {
	beats   []store.Heartbeat
	records int64 // what a counting heartbeat returns; < 0: the zones put and not gone
	zones   map[string]bool
}

func (r *recorder) RecordZoneStreams(_ context.Context, hb store.Heartbeat) (int64, error) {
	r.beats = append(r.beats, hb)
	if r.zones == nil {
		r.zones = map[string]bool{}
	}
	for _, z := range hb.Gone {
		delete(r.zones, z)
	}
	for _, z := range hb.Put {
		r.zones[z.Zone] = true
	}
	if len(hb.Put) == 0 && len(hb.Gone) == 0 && hb.ExpireBefore.IsZero() {
		return -1, nil
	}
	if r.records >= 0 {
		return r.records, nil
	}
	return int64(len(r.zones)), nil
}

func (r *recorder) ZoneStreams(context.Context, time.Time) ([]store.ZoneStream, error) {
	return nil, nil
}

func (r *recorder) OtherZoneStreams(context.Context, string, time.Time) ([]store.ZoneStream, error) {
	return nil, nil
}

// A heartbeat that changes nothing only refreshes the replica's row: it neither expires stale
// records nor counts this replica's, except every auditBeats beats, after a late beat, and
// after the store lost records (then every stream is put again).
func TestAHeartbeatThatChangesNothingOnlyRefreshes(t *testing.T) {
	g := NewWithT(t)
	rec := &recorder{records: -1}
	r := &replicas{id: "r1", address: "grpc://r1:5685", interval: 2 * time.Second, rec: rec, log: hclog.NewNullLogger(), recorded: map[string]int64{}}
	zones := []engine.NodeInsight{{Node: "a", Stream: 1, Connected: true}, {Node: "b", Stream: 2, Connected: true}, {Node: "c", Stream: 3}}
	now := time.Unix(1000, 0)
	beat := func() store.Heartbeat {
		t.Helper()
		now = now.Add(r.interval)
		r.beat(context.Background(), zones, false, now)
		return rec.beats[len(rec.beats)-1]
	}

	first := beat()
	g.Expect(first.Put).To(HaveLen(2), "the connected zones")
	g.Expect(first.ExpireBefore.IsZero()).To(BeFalse(), "the first beat expires stale records")

	quiet := beat()
	g.Expect(quiet.Put).To(BeEmpty())
	g.Expect(quiet.Gone).To(BeEmpty())
	g.Expect(quiet.ExpireBefore.IsZero()).To(BeTrue(), "nothing changed: no scan of every record")

	zones[1].Connected = false
	left := beat()
	g.Expect(left.Gone).To(Equal([]string{"b"}))
	g.Expect(left.Put).To(BeEmpty())

	zones[0].Stream = 7 // a reconnects
	again := beat()
	g.Expect(again.Put).To(HaveLen(1))
	g.Expect(again.Put[0].Zone).To(Equal("a"))

	for range auditBeats - 4 {
		g.Expect(beat().ExpireBefore.IsZero()).To(BeTrue())
	}
	g.Expect(beat().ExpireBefore.IsZero()).To(BeFalse(), "every auditBeats beats")

	now = now.Add(3 * r.interval) // a beat that came late: its records may have been expired
	g.Expect(beat().ExpireBefore.IsZero()).To(BeFalse())

	rec.records = 0 // another replica expired this one's records: the count says so
	zones[0].Stream = 8
	beat()
	rec.records = -1
	all := beat()
	g.Expect(all.Put).To(HaveLen(1), "every stream put again")
	g.Expect(all.ExpireBefore.IsZero()).To(BeFalse())
	g.Expect(beat().ExpireBefore.IsZero()).To(BeTrue(), "and back to refreshing only")
}

// A beat told the zones are the ones recorded (no stream opened or closed since) lists nothing and
// puts nothing, and keeps the record; one after the store lost records says it did not record
// them, so the next lists them again.
func TestAHeartbeatWithTheSameStreamsListsNothing(t *testing.T) {
	g := NewWithT(t)
	rec := &recorder{records: -1}
	r := &replicas{id: "r1", address: "grpc://r1:5685", interval: 2 * time.Second, rec: rec, log: hclog.NewNullLogger(), recorded: map[string]int64{}}
	zones := []engine.NodeInsight{{Node: "a", Stream: 1, Connected: true}, {Node: "b", Stream: 2, Connected: true}}
	now := time.Unix(1000, 0)
	g.Expect(r.beat(context.Background(), zones, false, now)).To(BeTrue())
	g.Expect(r.beat(context.Background(), nil, true, now.Add(r.interval))).To(BeTrue())
	last := rec.beats[len(rec.beats)-1]
	g.Expect(last.Put).To(BeEmpty())
	g.Expect(last.Gone).To(BeEmpty(), "the recorded zones are not taken for gone")
	g.Expect(r.recorded).To(Equal(map[string]int64{"a": 1, "b": 2}))

	rec.records = 0 // another replica expired this one's records
	g.Expect(r.beat(context.Background(), nil, true, now.Add(20*r.interval))).To(BeFalse(), "a late beat audits: the records are lost")
	rec.records = -1
	g.Expect(r.beat(context.Background(), zones, false, now.Add(21*r.interval))).To(BeTrue())
	g.Expect(rec.beats[len(rec.beats)-1].Put).To(HaveLen(2), "put again")
}

// The zones' streams generation moves with every stream opened or closed.
func TestTheStreamsGenerationMovesWithStreams(t *testing.T) {
	g := NewWithT(t)
	c := engine.NewCache([]string{"Mesh"})
	defer c.Close()
	zones := engine.NewNodes(c)
	o := zones.Observer()
	g0 := zones.StreamsGeneration()
	o.StreamOpened(1, "a")
	g1 := zones.StreamsGeneration()
	o.StreamClosed(1, "a")
	g2 := zones.StreamsGeneration()
	g.Expect(g1).NotTo(Equal(g0))
	g.Expect(g2).NotTo(Equal(g1))
}

package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/host/resource"
)

// A zone a replica recorded stays known after its stream, its records and its replica are gone,
// with the time of its first stream, until it is forgotten; then it is known again from its next
// recorded stream.
func TestAZoneOnceServedStaysKnownUntilForgotten(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		s := openStore(t, dsn)
		rec, reg := s.(ZoneStreamRecorder), s.(ZoneRegistry)
		t0 := time.UnixMilli(1_700_000_000_000)
		names := func() []string {
			zs, err := reg.KnownZones(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			out := []string{}
			for _, z := range zs {
				out = append(out, z.Zone)
			}
			return out
		}
		g.Expect(names()).To(BeEmpty())

		_, err := rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Now: t0,
			Put: []ZoneStream{{Zone: "zone-b", Since: t0.Add(-time.Second)}, {Zone: "zone-a", Since: t0}}})
		g.Expect(err).NotTo(HaveOccurred())
		// zone-b moves to r2 later: it keeps its first time.
		_, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r2", Now: t0.Add(time.Minute),
			Put: []ZoneStream{{Zone: "zone-b", Since: t0.Add(time.Minute)}}})
		g.Expect(err).NotTo(HaveOccurred())
		// r1 loses zone-a, then every record expires.
		_, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Now: t0.Add(2 * time.Minute), Gone: []string{"zone-a", "zone-b"}})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r3", Now: t0.Add(time.Hour), ExpireBefore: t0.Add(time.Hour)})
		g.Expect(err).NotTo(HaveOccurred())
		zs, err := rec.ZoneStreams(ctx, time.Time{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(zs).To(BeEmpty())

		known, err := reg.KnownZones(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(known).To(Equal([]KnownZone{{Zone: "zone-a", FirstSeen: t0}, {Zone: "zone-b", FirstSeen: t0.Add(-time.Second)}}))

		forgot, err := reg.ForgetZone(ctx, "zone-a")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(forgot).To(BeTrue())
		forgot, err = reg.ForgetZone(ctx, "zone-a")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(forgot).To(BeFalse(), "a zone not known is not forgotten twice")
		_, err = reg.ForgetZone(ctx, "")
		g.Expect(err).To(MatchError(ContainSubstring("name is empty")))
		g.Expect(names()).To(Equal([]string{"zone-b"}))

		_, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Now: t0.Add(2 * time.Hour),
			Put: []ZoneStream{{Zone: "zone-a", Since: t0.Add(2 * time.Hour)}}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(names()).To(Equal([]string{"zone-a", "zone-b"}))
	})
}

// A database migrated before known zones existed knows the zones of the streams it recorded.
func TestMigratingKnowsTheZonesOfRecordedStreams(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		db, d := rawDB(t, dsn)
		_, err := migrate(ctx, db, d, migrations()[:7])
		g.Expect(err).NotTo(HaveOccurred())
		for _, q := range []string{
			`INSERT INTO zone_streams (zone, replica, address, since_ms, heartbeat_ms) VALUES ('zone-1', 'r1', '', 2000, 3000)`,
			`INSERT INTO zone_streams (zone, replica, address, since_ms, heartbeat_ms) VALUES ('zone-1', 'r2', '', 1000, 3000)`,
			`INSERT INTO zone_streams (zone, replica, address, since_ms, heartbeat_ms) VALUES ('zone-2', 'r1', '', 5000, 6000)`,
		} {
			_, err = db.ExecContext(ctx, q)
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(db.Close()).To(Succeed())

		known, err := openStore(t, dsn).(ZoneRegistry).KnownZones(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(known).To(Equal([]KnownZone{{Zone: "zone-1", FirstSeen: time.UnixMilli(1000)}, {Zone: "zone-2", FirstSeen: time.UnixMilli(5000)}}))
	})
}

// The observer is told of each operation once, by its name, with its error: a Put is one write,
// a Get of what is not there a get that failed.
func TestTheObserverIsToldOfEachOperation(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		s := openStore(t, dsn)
		var mu sync.Mutex
		var ops []string
		var failed []string
		s.(Observable).ObserveOperations(func(op string, took time.Duration, err error) {
			mu.Lock()
			defer mu.Unlock()
			g.Expect(took).To(BeNumerically(">=", 0))
			ops = append(ops, op)
			if err != nil {
				failed = append(failed, op)
			}
		})
		_, _, err := s.Put(ctx, mesh("m"))
		g.Expect(err).NotTo(HaveOccurred())
		_, err = s.Get(ctx, resource.Key{Kind: resource.MeshKind, Name: "absent"})
		g.Expect(errors.Is(err, ErrNotFound)).To(BeTrue())
		_, err = s.Revision(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = s.(ZoneRegistry).KnownZones(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		s.(Observable).ObserveOperations(nil)
		_, err = s.Revision(ctx)
		g.Expect(err).NotTo(HaveOccurred())

		mu.Lock()
		defer mu.Unlock()
		g.Expect(ops).To(Equal([]string{opWrite, opGet, opRevision, opKnownZones}))
		g.Expect(failed).To(Equal([]string{opGet}))
		for _, op := range ops {
			g.Expect(Operations).To(ContainElement(op))
		}
	})
}

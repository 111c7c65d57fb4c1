package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestZoneStreams(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		s := openStore(t, dsn)
		rec := s.(ZoneStreamRecorder)
		t0 := time.UnixMilli(1_700_000_000_000)
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		where := func(zs []ZoneStream) []string {
			out := []string{}
			for _, z := range zs {
				out = append(out, z.Zone+"@"+z.Replica)
			}
			return out
		}

		n, err := rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Address: "grpc://a:1", Now: at(0),
			Put: []ZoneStream{{Zone: "z2", Since: at(-time.Second)}, {Zone: "z1", Since: at(-2 * time.Second)}}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal(int64(2)))
		zs, err := rec.ZoneStreams(ctx, at(0))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(zs).To(Equal([]ZoneStream{
			{Zone: "z1", Replica: "r1", Address: "grpc://a:1", Since: at(-2 * time.Second), Heartbeat: at(0)},
			{Zone: "z2", Replica: "r1", Address: "grpc://a:1", Since: at(-time.Second), Heartbeat: at(0)},
		}))

		// z1 moves to r2; r1 has not noticed yet: both record it.
		n, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r2", Address: "grpc://b:1", Now: at(time.Second),
			Put: []ZoneStream{{Zone: "z1", Since: at(time.Second)}}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal(int64(1)))
		zs, _ = rec.ZoneStreams(ctx, time.Time{})
		g.Expect(where(zs)).To(Equal([]string{"z1@r1", "z1@r2", "z2@r1"}))

		// r1 notices; a heartbeat refreshes what it keeps.
		n, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Now: at(2 * time.Second), Gone: []string{"z1"}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal(int64(1)))
		zs, _ = rec.ZoneStreams(ctx, at(2*time.Second))
		g.Expect(zs).To(HaveLen(1))
		g.Expect(zs[0]).To(Equal(ZoneStream{Zone: "z2", Replica: "r1", Address: "grpc://a:1", Since: at(-time.Second), Heartbeat: at(2 * time.Second)}))

		// r1 dies: r2's heartbeats expire its records.
		n, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r2", Now: at(10 * time.Second), ExpireBefore: at(5 * time.Second)})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal(int64(1)))
		zs, _ = rec.ZoneStreams(ctx, time.Time{})
		g.Expect(where(zs)).To(Equal([]string{"z1@r2"}))
		zs, _ = rec.ZoneStreams(ctx, at(11*time.Second))
		g.Expect(zs).To(BeEmpty(), "stale records are not returned")

		// A replica reads the others' records only.
		zs, err = rec.OtherZoneStreams(ctx, "r2", time.Time{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(zs).To(BeEmpty())
		n, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r3", Address: "grpc://c:1", Now: at(11 * time.Second),
			Put: []ZoneStream{{Zone: "z3", Since: at(11 * time.Second)}}})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal(int64(1)))
		zs, _ = rec.OtherZoneStreams(ctx, "r2", time.Time{})
		g.Expect(where(zs)).To(Equal([]string{"z3@r3"}))

		// A record written by a replica of the version before (no heartbeat row: it refreshes its
		// records themselves) is fresh while its own heartbeat is, and expired after.
		_, err = s.(*sqlStore).w.ExecContext(ctx, s.(*sqlStore).d.rebind(`INSERT INTO zone_streams (zone, replica, address, since_ms, heartbeat_ms)
			VALUES (?, ?, ?, ?, ?)`), "z4", "old", "grpc://d:1", at(12*time.Second).UnixMilli(), at(12*time.Second).UnixMilli())
		g.Expect(err).NotTo(HaveOccurred())
		zs, _ = rec.ZoneStreams(ctx, at(12*time.Second))
		g.Expect(where(zs)).To(Equal([]string{"z4@old"}))
		_, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r2", Now: at(20 * time.Second), ExpireBefore: at(15 * time.Second)})
		g.Expect(err).NotTo(HaveOccurred())
		zs, _ = rec.ZoneStreams(ctx, time.Time{})
		g.Expect(where(zs)).To(Equal([]string{"z1@r2"}), "r3's and the old replica's records expired, r2's refreshed")

		// Records are not resources.
		g.Expect(revision(t, s)).To(BeZero())
		g.Expect(s.Changes()).NotTo(Receive())
		_, err = rec.RecordZoneStreams(ctx, Heartbeat{Now: at(0)})
		g.Expect(err).To(MatchError(ContainSubstring("replica id is empty")))
	})
}

// TestZoneStreamsInChunks writes and deletes more zones than one statement takes, and a zone put
// twice in one heartbeat, on each backend.
func TestZoneStreamsInChunks(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		g, ctx := NewWithT(t), context.Background()
		rec := openStore(t, dsn).(ZoneStreamRecorder)
		t0 := time.UnixMilli(1_700_000_000_000)
		n := 2*zoneStreamsChunk + 1
		put := make([]ZoneStream, n)
		for i := range put {
			put[i] = ZoneStream{Zone: fmt.Sprintf("zone-%04d", i), Since: t0}
		}
		// zone-0000 again, later, in the same statement: the last one is what is recorded, as one
		// write at a time would leave it.
		put = slices.Insert(put, 1, ZoneStream{Zone: "zone-0000", Since: t0.Add(time.Second)})
		count, err := rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Address: "grpc://a:1", Now: t0, Put: put})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(count).To(Equal(int64(n)))
		zs, err := rec.ZoneStreams(ctx, t0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(zs).To(HaveLen(n))
		g.Expect(zs[0]).To(Equal(ZoneStream{Zone: "zone-0000", Replica: "r1", Address: "grpc://a:1", Since: t0.Add(time.Second), Heartbeat: t0}))
		g.Expect(zs[n-1].Zone).To(Equal(fmt.Sprintf("zone-%04d", n-1)))

		// Every zone but the middle one goes, across three statements.
		gone := []string{}
		for i := range n {
			if i != zoneStreamsChunk {
				gone = append(gone, fmt.Sprintf("zone-%04d", i))
			}
		}
		count, err = rec.RecordZoneStreams(ctx, Heartbeat{Replica: "r1", Now: t0.Add(time.Second), Gone: gone})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(count).To(Equal(int64(1)))
		zs, err = rec.ZoneStreams(ctx, t0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(zs).To(HaveLen(1))
		g.Expect(zs[0].Zone).To(Equal(fmt.Sprintf("zone-%04d", zoneStreamsChunk)))
	})
}

func TestPlaceholders(t *testing.T) {
	g := NewWithT(t)
	g.Expect(placeholders(1, 1)).To(Equal("?"))
	g.Expect(placeholders(3, 1)).To(Equal("?, ?, ?"))
	g.Expect(placeholders(2, 3)).To(Equal("(?, ?, ?), (?, ?, ?)"))
	g.Expect(dialectPostgres.rebind("IN (" + placeholders(3, 1) + ")")).To(Equal("IN ($1, $2, $3)"))
}

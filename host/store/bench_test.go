package store

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kds-host/kds-host/host/resource"
)

// BenchmarkApply1000 applies a response of 1000 resources (a Mesh and 999 policies across
// the built-in kinds) to SQLite; every iteration changes every spec, so all 1000 rows are
// written.
func BenchmarkApply1000(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "kds.db"), "")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	kinds := resource.Default().Names()[1:]
	puts := make([]resource.Resource, 1000)
	puts[0] = resource.Resource{Kind: resource.MeshKind, Name: "bench", Spec: json.RawMessage(`{}`), Generation: 1}
	for i := 1; i < len(puts); i++ {
		puts[i] = resource.Resource{Kind: kinds[i%len(kinds)], Mesh: "bench", Name: fmt.Sprintf("policy-%04d", i),
			Labels: map[string]string{"kuma.io/origin": "global", "kuma.io/zone": "zone-1"}}
	}
	b.ReportAllocs()
	iter := 0
	for b.Loop() {
		iter++
		for i := range puts {
			puts[i].Spec = json.RawMessage(fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"%ds"}}`, iter))
			puts[i].Generation = int64(iter)
		}
		failed, err := s.Apply(ctx, puts, nil)
		if err != nil || len(failed) > 0 {
			b.Fatal(err, failed)
		}
	}
	b.ReportMetric(float64(b.N*len(puts))/b.Elapsed().Seconds(), "resources/s")
}

// BenchmarkRecordZoneStreams10000 is a replica's heartbeat at 10,000 zones: the first one after
// they connected (put: every zone's record written), and one after they all moved to another
// replica and back (move: every record deleted, then written again), on each backend.
func BenchmarkRecordZoneStreams10000(b *testing.B) {
	const zones = 10000
	eachBackend(b, func(b *testing.B, dsn string) {
		ctx := context.Background()
		rec := openStore(b, dsn).(ZoneStreamRecorder)
		t0 := time.UnixMilli(1_700_000_000_000)
		put := make([]ZoneStream, zones)
		gone := make([]string, zones)
		for i := range put {
			put[i] = ZoneStream{Zone: fmt.Sprintf("zone-%05d", i), Since: t0}
			gone[i] = put[i].Zone
		}
		beat := func(b *testing.B, hb Heartbeat) {
			hb.Replica, hb.Address = "r1", "grpc://10.0.0.1:5685"
			if _, err := rec.RecordZoneStreams(ctx, hb); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("put", func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				beat(b, Heartbeat{Now: t0.Add(time.Duration(i) * time.Second), Put: put})
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*zones), "us/zone")
		})
		b.Run("move", func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				beat(b, Heartbeat{Now: t0.Add(time.Duration(i) * time.Second), Gone: gone})
				beat(b, Heartbeat{Now: t0.Add(time.Duration(i) * time.Second), Put: put})
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*zones), "us/zone")
		})
	})
}

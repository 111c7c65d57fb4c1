package store

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

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

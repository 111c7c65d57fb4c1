package store

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/kds-host/kds-host/host/resource"
)

// BenchmarkList10000 lists a store of 10,000 resources (a Mesh and its policies, labelled),
// on each backend: what a global's first snapshot and every full resync read.
func BenchmarkList10000(b *testing.B) {
	eachBackend(b, func(b *testing.B, dsn string) {
		ctx := context.Background()
		s := openStore(b, dsn)
		kinds := resource.Default().Names()[1:]
		puts := make([]resource.Resource, 10000)
		puts[0] = resource.Resource{Kind: resource.MeshKind, Name: "bench", Spec: json.RawMessage(`{}`), Generation: 1}
		for i := 1; i < len(puts); i++ {
			puts[i] = resource.Resource{Kind: kinds[i%len(kinds)], Mesh: "bench", Name: fmt.Sprintf("policy-%05d", i), Generation: 1,
				Labels: map[string]string{"kuma.io/origin": "global", "kuma.io/zone": "zone-1"},
				Spec:   json.RawMessage(`{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"1s"}}`)}
		}
		if failed, err := s.Apply(ctx, puts, nil); err != nil || len(failed) > 0 {
			b.Fatal(err, failed)
		}
		b.ReportAllocs()
		for b.Loop() {
			rs, err := s.List(ctx, "", "")
			if err != nil || len(rs) != len(puts) {
				b.Fatal(err, len(rs))
			}
		}
	})
}

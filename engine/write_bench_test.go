package engine

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/kds-host/kds-host/host/resource"
)

// BenchmarkWrite is one write reaching every stream of kds's own loop, without gRPC: the cache's
// fan-out, each stream's answer and send, and each zone's ACK handled by its stream's request
// goroutine. ns/stream is a write's cost a stream; the scale bench (examples/bench/scale) adds
// gRPC's sends and receives, and the garbage collector, to it.
func BenchmarkWrite(b *testing.B) {
	for _, n := range []int{1000} {
		b.Run(fmt.Sprintf("streams-%d", n), func(b *testing.B) {
			c := NewCache([]string{"MeshTimeout"})
			defer c.Close()
			tr := NewTracker(c)
			var sb testSnapshots
			rs := make([]resource.Resource, 100)
			for i := range rs {
				rs[i] = policyAt("MeshTimeout", fmt.Sprintf("p%03d", i), 1, 100)
			}
			s, err := sb.Build(rs)
			if err != nil {
				b.Fatal(err)
			}
			c.SetSnapshot(s)
			zones := make([]*loopZone, n)
			for i := range zones {
				zones[i] = startLoopZone(c, tr, int64(i+1), fmt.Sprintf("z%d", i))
			}
			defer func() {
				for _, z := range zones {
					z.cancel()
					<-z.done
				}
			}()
			receiveAll := func() {
				for _, z := range zones {
					z.ack(<-z.str.sent)
				}
				for i := range zones { // every ACK handled: the next write finds each stream in step
					for c.Session(int64(i+1)).InFlight() > 0 {
						runtime.Gosched()
					}
				}
			}
			receiveAll() // the full sync
			gen := int64(1)
			b.ResetTimer()
			for b.Loop() {
				gen++
				s, err := sb.Update([]resource.Resource{policyAt("MeshTimeout", "p001", gen, 100)}, nil)
				if err != nil {
					b.Fatal(err)
				}
				c.SetSnapshot(s)
				receiveAll()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
		})
	}
}

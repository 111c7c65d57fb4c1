package controlplane

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// convergenceRun writes Mesh "m" at version v1 to the snapshot, streams 1 and 2 connected (and
// stream 3 of a zone that disconnected), and returns the convergence and the snapshot written.
func convergenceRun(t *testing.T) (*convergence, *engine.Snapshot) {
	t.Helper()
	c := newConvergence(prometheus.NewRegistry())
	e := &engine.Entry{TypeURL: "Mesh", Name: "m", Version: "v1", Source: &kds.Source{Key: resource.Key{Kind: "Mesh", Name: "m"}}}
	prev := engine.SnapshotOf(nil)
	next := prev.Update([]*engine.Entry{e}, nil)
	zones := []engine.NodeInsight{{Node: "a", Connected: true, Stream: 1}, {Node: "b", Connected: true, Stream: 2}, {Node: "c", Stream: 3}}
	c.written(prev, next, nil, zones, time.Now())
	return c, next
}

func ack(stream int64, node, version string) event.ACK {
	return event.ACK{StreamID: stream, Node: node, TypeURL: "Mesh", Versions: event.VersionsOf(map[string]string{"m": version})}
}

// observed is the histogram's count and sum, and the dropped counter.
func observed(t *testing.T, c *convergence) (count uint64, sum float64, dropped float64) {
	t.Helper()
	var h, d dto.Metric
	if err := c.seconds.Write(&h); err != nil {
		t.Fatal(err)
	}
	if err := c.dropped.Write(&d); err != nil {
		t.Fatal(err)
	}
	return h.Histogram.GetSampleCount(), h.Histogram.GetSampleSum(), d.Counter.GetValue()
}

func TestConvergenceObservesTheLastStreamsACK(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := convergenceRun(t)
		time.Sleep(time.Second)
		c.acked(ack(1, "a", "v1"))
		c.acked(ack(2, "b", "v0")) // an older version: still waited for
		time.Sleep(time.Second)
		if n, _, _ := observed(t, c); n != 0 {
			t.Fatalf("observed %d before stream 2 ACKed v1", n)
		}
		c.acked(ack(2, "b", "v1"))
		n, sum, dropped := observed(t, c)
		if n != 1 || sum != 2 || dropped != 0 {
			t.Fatalf("count %d sum %v dropped %v, want 1 observation of 2 s", n, sum, dropped)
		}
		if c.n.Load() != 0 {
			t.Fatalf("%d names still awaited", c.n.Load())
		}
	})
}

func TestConvergenceStopsWaitingForAClosedStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := convergenceRun(t)
		time.Sleep(time.Second)
		c.acked(ack(1, "a", "v1"))
		time.Sleep(time.Second)
		c.closed(2)
		n, sum, _ := observed(t, c)
		if n != 1 || sum != 1 {
			t.Fatalf("count %d sum %v, want the observation at stream 1's ACK, 1 s", n, sum)
		}
		c.closed(1)
		if len(c.index) != 0 || len(c.free) != 2 {
			t.Fatalf("index %v free %v: a closed stream's index is freed", c.index, c.free)
		}
	})
}

func TestConvergenceAStreamClosedUnheardIsForgottenAtTheNextWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, snap := convergenceRun(t)
		// Stream 2 closes, but its close was heard before the write indexed it: the next write
		// no longer lists it, and what waited for it is observed at stream 1's ACK.
		c.acked(ack(1, "a", "v1"))
		e := &engine.Entry{TypeURL: "Mesh", Name: "other", Version: "v1", Source: &kds.Source{Key: resource.Key{Kind: "Mesh", Name: "other"}}}
		c.written(snap, snap.Update([]*engine.Entry{e}, nil), nil, []engine.NodeInsight{{Node: "a", Connected: true, Stream: 1}}, time.Now())
		if n, _, _ := observed(t, c); n != 1 {
			t.Fatalf("count %d, want m observed once stream 2 is gone", n)
		}
		if _, ok := c.index[2]; ok {
			t.Fatal("stream 2 still has an index")
		}
	})
}

func TestConvergenceAnACKOfSomeOfTheNamesAwaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, snap := convergenceRun(t)
		e := &engine.Entry{TypeURL: "Mesh", Name: "n", Version: "v1", Source: &kds.Source{Key: resource.Key{Kind: "Mesh", Name: "n"}}}
		zones := []engine.NodeInsight{{Node: "a", Connected: true, Stream: 1}, {Node: "b", Connected: true, Stream: 2}}
		c.written(snap, snap.Update([]*engine.Entry{e}, nil), nil, zones, time.Now())
		time.Sleep(time.Second)
		c.acked(ack(1, "a", "v1")) // answers m, not n: the ACK's names are walked
		c.acked(ack(2, "b", "v1"))
		if n, sum, _ := observed(t, c); n != 1 || sum != 1 {
			t.Fatalf("count %d sum %v, want m observed once, at 1 s", n, sum)
		}
		if c.n.Load() != 1 {
			t.Fatalf("%d names awaited, want n", c.n.Load())
		}
	})
}

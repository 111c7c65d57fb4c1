package owner

import (
	"fmt"
	"reflect"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/resource"
)

// Defect 2: taking a zone deleted it from the front of a slice, moving every zone behind it: a
// write to n zones cost O(n^2). A take must move no other zone; growing the queue may copy it,
// O(n) in all.
func TestZoneQueueTakesInLinearWork(t *testing.T) {
	const zones = 10_000
	for _, tc := range []struct {
		name  string
		round func(q *nodeQueue, next func() string) // pushes and pops, in FIFO order
	}{
		{
			name: "queued in a row",
			round: func(q *nodeQueue, next func() string) {
				for range zones {
					q.push(next())
				}
			},
		},
		{
			name: "queued in bursts, the ring wrapping around",
			round: func(q *nodeQueue, next func() string) {
				for range zones / 2 {
					q.push(next())
				}
				for i := range zones / 2 {
					q.push(next())
					if i%2 == 0 {
						q.push(next())
					}
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			var q nodeQueue
			pushed, popped := 0, 0
			next := func() string { pushed++; return fmt.Sprint("zone-", pushed-1) }
			pop := func() {
				z, ok := q.pop()
				g.Expect(ok).To(BeTrue())
				g.Expect(z).To(Equal(fmt.Sprint("zone-", popped)), "first in, first out")
				popped++
			}
			tc.round(&q, func() string {
				if pushed > zones/2 && pushed%3 == 0 {
					pop() // the workers take while zones are queued
				}
				return next()
			})
			g.Expect(q.len()).To(Equal(pushed - popped))
			for q.len() > 0 {
				pop()
			}
			_, ok := q.pop()
			g.Expect(ok).To(BeFalse(), "empty")
			g.Expect(q.moves).To(BeNumerically("<=", 2*pushed), "zones moved, for %d pushed", pushed)
		})
	}
}

// Holds queues each zone with work once, whatever is queued before it, and the take of 10,000
// queued zones moves O(10,000) zones.
func TestHoldsTakesQueuedZonesInLinearWork(t *testing.T) {
	g := NewWithT(t)
	h := &Holds{nodes: map[string]*nodeHolds{}, scheduled: map[string]bool{}, wake: make(chan struct{}, 1)}
	var names []string
	for i := range 10_000 {
		names = append(names, fmt.Sprint("zone-", i))
	}
	h.enqueue(names...)
	h.enqueue(names[:100]...) // queued already: not again
	var taken []string
	for {
		z, ok := h.take()
		if !ok {
			break
		}
		taken = append(taken, z)
	}
	g.Expect(taken).To(Equal(names))
	g.Expect(h.queue.moves).To(BeNumerically("<=", 2*len(names)))
}

// A write's changed keys are one map that the zones with no other work share; a zone that adds
// work of its own copies it first, so no other zone's work changes.
func TestAWritesKeysAreSharedUntilAZoneAddsToThem(t *testing.T) {
	g := NewWithT(t)
	write := map[engine.Ref]bool{ref(resource.Key{Kind: "MeshTimeout", Mesh: "m1", Name: "p1"}): true}
	var a, b, c pending
	c.addWork(ref(resource.Key{Kind: resource.MeshKind, Name: "m9"})) // work of its own already
	for _, p := range []*pending{&a, &b, &c} {
		p.addWrite(write)
	}
	same := func(m map[engine.Ref]bool) bool {
		return reflect.ValueOf(m).UnsafePointer() == reflect.ValueOf(write).UnsafePointer()
	}
	g.Expect(same(a.keys)).To(BeTrue(), "no work of its own: the write's map, shared")
	g.Expect(same(b.keys)).To(BeTrue())
	g.Expect(c.keys).To(HaveLen(2), "work of its own: the write's keys added to it")

	a.addWork(ref(resource.Key{Kind: "MeshTimeout", Mesh: "m1", Name: "p1"})) // already there: no copy
	g.Expect(same(a.keys)).To(BeTrue())
	a.addWork(ref(resource.Key{Kind: resource.MeshKind, Name: "m1"}))
	g.Expect(a.keys).To(HaveLen(2))
	g.Expect(write).To(HaveLen(1), "the shared map is never written")
	g.Expect(b.keys).To(HaveLen(1))
}

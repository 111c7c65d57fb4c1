package controlplane

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
)

// Bounds of what convergence tracks: names written and not yet ACKed by every zone, and how
// long one is waited for. A write past either is counted as dropped, not observed.
const (
	maxConverging   = 1024
	convergeTimeout = 10 * time.Minute
)

// convergence measures, for each name a store write changed, the time from the write to the
// ACK of the last zone connected to this replica that was to get it (kds_convergence_seconds).
// The zones waited for are those connected when the snapshot with the write is published; one
// that disconnects is no longer waited for. Each zone has a small number (index), and each
// name written a bit set of the zones it waits for, so a write to 10,000 zones costs 1.25 KB a
// name.
type convergence struct {
	seconds prometheus.Histogram
	dropped prometheus.Counter

	mu      sync.Mutex // guards the fields below; never held across a call out
	index   map[string]int
	free    []int // indexes of zones forgotten, to reuse
	pending map[engine.Ref]*converging
	n       atomic.Int32 // len(pending), read without the lock by ACKs when nothing is pending
}

// converging is one name written and not yet ACKed by every zone it waits for.
type converging struct {
	version string // "" for a removal
	written time.Time
	waiting bitset
	left    int       // zones in waiting
	lastACK time.Time // the latest ACK among the zones that did ACK
}

type bitset []uint64

func (b bitset) has(i int) bool { return i/64 < len(b) && b[i/64]&(1<<(i%64)) != 0 }
func (b bitset) clear(i int) {
	if i/64 < len(b) {
		b[i/64] &^= 1 << (i % 64)
	}
}

func newConvergence(reg prometheus.Registerer) *convergence {
	c := &convergence{
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kds_convergence_seconds",
			Help:    "Time from a resource's write to the store to the ACK of the last zone connected to this replica that was to get it (one observation a name written; the write's time is the store's modification time, a deletion's the time this replica read it).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "kds_convergence_dropped_total",
			Help: "Names written that kds_convergence_seconds does not observe: not ACKed by every zone within 10 minutes (refused, withheld), or written while 1,024 were still awaited."}),
		index:   map[string]int{},
		pending: map[engine.Ref]*converging{},
	}
	reg.MustRegister(c.seconds, c.dropped)
	return c
}

// written is told, before the snapshot next is published, what it changes from prev and when
// each change was written (changed: the resources the store returned; a name not among them was
// deleted, at now), and the zones connected now.
func (c *convergence) written(prev, next *engine.Snapshot, changed []resource.Resource, zones []engine.NodeInsight, now time.Time) {
	names, ok := next.ChangesFrom(prev)
	if !ok || len(names) == 0 {
		return
	}
	at := make(map[resource.Key]time.Time, len(changed))
	for _, r := range changed {
		if !r.ModificationTime.IsZero() {
			at[r.Key()] = r.ModificationTime
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var waiting bitset
	left := 0
	for _, zi := range zones {
		if !zi.Connected {
			continue
		}
		i := c.indexLocked(zi.Node)
		for i/64 >= len(waiting) {
			waiting = append(waiting, 0)
		}
		waiting[i/64] |= 1 << (i % 64)
		left++
	}
	c.expireLocked(now)
	for kind, ns := range names {
		entries := next.Type(kind)
		for _, name := range ns {
			ref := engine.Ref{TypeURL: kind, Name: name}
			if _, ok := c.pending[ref]; ok {
				delete(c.pending, ref) // overwritten before every zone had it
				c.dropped.Inc()
			}
			if left == 0 {
				continue
			}
			if len(c.pending) >= maxConverging {
				c.dropped.Inc()
				continue
			}
			p := &converging{written: now, waiting: append(bitset(nil), waiting...), left: left}
			if e := entries[name]; e != nil {
				p.version = e.Version
				if t, ok := at[kds.KeyOf(e)]; ok && t.Before(now) {
					p.written = t
				}
			}
			c.pending[ref] = p
		}
	}
	c.n.Store(int32(len(c.pending)))
}

// indexLocked is zone's index, given on first use.
func (c *convergence) indexLocked(zone string) int {
	if i, ok := c.index[zone]; ok {
		return i
	}
	i := len(c.index)
	if n := len(c.free); n > 0 {
		i, c.free = c.free[n-1], c.free[:n-1]
	}
	c.index[zone] = i
	return i
}

// expireLocked drops what has been waited for longer than convergeTimeout.
func (c *convergence) expireLocked(now time.Time) {
	for ref, p := range c.pending {
		if now.Sub(p.written) > convergeTimeout {
			delete(c.pending, ref)
			c.dropped.Inc()
		}
	}
}

// acked takes in a zone's ACK: each name it stored at the version written, or removed, is no
// longer waited for from that zone.
func (c *convergence) acked(a event.ACK) {
	if a.Initial || c.n.Load() == 0 {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[a.Node]
	if !ok {
		return
	}
	// Not a itself: what the loop's body reads moves to the heap, and ACKs are many.
	versions, typeURL := a.Versions, a.TypeURL
	for name, version := range versions.All() {
		c.doneLocked(engine.Ref{TypeURL: typeURL, Name: name}, version, i, now)
	}
	for _, name := range a.Removed {
		c.doneLocked(engine.Ref{TypeURL: a.TypeURL, Name: name}, "", i, now)
	}
	c.n.Store(int32(len(c.pending)))
}

func (c *convergence) doneLocked(ref engine.Ref, version string, zone int, now time.Time) {
	p := c.pending[ref]
	if p == nil || p.version != version || !p.waiting.has(zone) {
		return
	}
	p.waiting.clear(zone)
	p.left--
	p.lastACK = now
	if p.left == 0 {
		c.seconds.Observe(now.Sub(p.written).Seconds())
		delete(c.pending, ref)
	}
}

// closed takes in a zone's stream closing: it is no longer waited for, and what waited for it
// alone is observed at the last ACK of the others, if any.
func (c *convergence) closed(zone string) {
	if c.n.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.index[zone]
	if !ok {
		return
	}
	for ref, p := range c.pending {
		if !p.waiting.has(i) {
			continue
		}
		p.waiting.clear(i)
		if p.left--; p.left == 0 {
			if !p.lastACK.IsZero() {
				c.seconds.Observe(p.lastACK.Sub(p.written).Seconds())
			} else {
				c.dropped.Inc()
			}
			delete(c.pending, ref)
		}
	}
	c.n.Store(int32(len(c.pending)))
}

// forget frees a zone's index (the zone left the zone table): no name waits for it any more,
// as it closed its stream before.
func (c *convergence) forget(zone string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i, ok := c.index[zone]; ok {
		delete(c.index, zone)
		c.free = append(c.free, i)
	}
}

func (c *convergence) observer() event.Observer {
	return event.Observer{ACK: c.acked, StreamClosed: func(_ int64, zone string) { c.closed(zone) }}
}

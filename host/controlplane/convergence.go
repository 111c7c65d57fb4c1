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
// The zones waited for are the streams open when the snapshot with the write is published; one
// that closes is no longer waited for. Each open stream has a small number (index), and each
// name written a bit set of the streams it waits for, so a write to 10,000 zones costs 1.25 KB a
// name. An ACK costs a lookup of its stream's index and one of each name it answered among
// those awaited of its type.
type convergence struct {
	seconds prometheus.Histogram
	dropped prometheus.Counter

	mu      sync.Mutex                        // guards the fields below; never held across a call out
	index   map[int64]int                     // stream id -> index, for the streams some write waited for
	free    []int                             // indexes of closed streams, to reuse
	pending map[string]map[string]*converging // type URL -> name -> what waits for it
	n       atomic.Int32                      // names in pending; changed under mu, read without it by ACKs when nothing is pending
}

// converging is one name written and not yet ACKed by every zone it waits for.
type converging struct {
	version string // "" for a removal
	written time.Time
	waiting bitset
	left    int       // streams in waiting
	lastACK time.Time // the latest ACK among the streams that did ACK
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
		index:   map[int64]int{},
		pending: map[string]map[string]*converging{},
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
		i := c.indexLocked(zi.Stream)
		for i/64 >= len(waiting) {
			waiting = append(waiting, 0)
		}
		waiting[i/64] |= 1 << (i % 64)
		left++
	}
	for stream, i := range c.index {
		if !waiting.has(i) {
			c.closedLocked(stream) // closed before its index was given, so not told
		}
	}
	c.expireLocked(now)
	for kind, ns := range names {
		entries := next.Type(kind)
		for _, name := range ns {
			if _, ok := c.pending[kind][name]; ok {
				c.deleteLocked(kind, name) // overwritten before every zone had it
				c.dropped.Inc()
			}
			if left == 0 {
				continue
			}
			if c.n.Load() >= maxConverging {
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
			if c.pending[kind] == nil {
				c.pending[kind] = map[string]*converging{}
			}
			c.pending[kind][name] = p
			c.n.Add(1)
		}
	}
}

// indexLocked is stream's index, given on first use.
func (c *convergence) indexLocked(stream int64) int {
	if i, ok := c.index[stream]; ok {
		return i
	}
	i := len(c.index)
	if n := len(c.free); n > 0 {
		i, c.free = c.free[n-1], c.free[:n-1]
	}
	c.index[stream] = i
	return i
}

func (c *convergence) deleteLocked(typeURL, name string) {
	delete(c.pending[typeURL], name)
	if len(c.pending[typeURL]) == 0 {
		delete(c.pending, typeURL)
	}
	c.n.Add(-1)
}

// expireLocked drops what has been waited for longer than convergeTimeout.
func (c *convergence) expireLocked(now time.Time) {
	for kind, ps := range c.pending {
		for name, p := range ps {
			if now.Sub(p.written) > convergeTimeout {
				c.deleteLocked(kind, name)
				c.dropped.Inc()
			}
		}
	}
}

// acked takes in a zone's ACK: each name it stored at the version written, or removed, is no
// longer waited for from that stream.
func (c *convergence) acked(a event.ACK) {
	if a.Initial || c.n.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := c.pending[a.TypeURL]
	if len(ps) == 0 {
		return
	}
	i, ok := c.index[a.StreamID]
	if !ok {
		return
	}
	var now time.Time // read once, at the first name that was waited for
	// Whichever is shorter is walked: what is awaited of the type (few, between writes) or
	// what the ACK answered (a write's own names).
	if len(ps) <= a.Versions.Len() {
		for name, p := range ps {
			if version, ok := a.Versions.Get(name); ok {
				c.doneLocked(a.TypeURL, name, p, version, i, &now)
			}
		}
	} else {
		now = c.eachAnsweredLocked(ps, a.TypeURL, a.Versions, i, now)
	}
	for _, name := range a.Removed {
		if p := ps[name]; p != nil {
			c.doneLocked(a.TypeURL, name, p, "", i, &now)
		}
	}
}

// eachAnsweredLocked is acked's walk of the names answered. It is a function of its own because
// ranging over Versions.All makes the loop's body a closure, and what it captures goes to the
// heap: acked's own variables stay on the stack on the common path.
func (c *convergence) eachAnsweredLocked(ps map[string]*converging, typeURL string, versions event.Versions, stream int, now time.Time) time.Time {
	for name, version := range versions.All() {
		if p := ps[name]; p != nil {
			c.doneLocked(typeURL, name, p, version, stream, &now)
		}
	}
	return now
}

func (c *convergence) doneLocked(typeURL, name string, p *converging, version string, stream int, now *time.Time) {
	if p.version != version || !p.waiting.has(stream) {
		return
	}
	if now.IsZero() {
		*now = time.Now()
	}
	p.waiting.clear(stream)
	p.left--
	p.lastACK = *now
	if p.left == 0 {
		c.seconds.Observe(now.Sub(p.written).Seconds())
		c.deleteLocked(typeURL, name)
	}
}

// closed takes in a stream closing: it is no longer waited for, and what waited for it alone is
// observed at the last ACK of the others, if any.
func (c *convergence) closed(stream int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closedLocked(stream)
}

func (c *convergence) closedLocked(stream int64) {
	i, ok := c.index[stream]
	if !ok {
		return
	}
	delete(c.index, stream)
	c.free = append(c.free, i)
	for kind, ps := range c.pending {
		for name, p := range ps {
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
				c.deleteLocked(kind, name)
			}
		}
	}
}

func (c *convergence) observer() event.Observer {
	return event.Observer{ACK: c.acked, StreamClosed: func(id int64, _ string) { c.closed(id) }}
}

package guard

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/kds-host/kds-host/engine"
)

// snapPool shares one engine snapshot among the nodes of a per-node cache whose answers made
// equal ones (the same entries, by type): the engine makes a snapshot's name orders, encodings
// and reference index once, so the nodes of one configuration cost that once, not once each.
type snapPool struct {
	mu sync.Mutex           // guards by and the users of what it holds
	by map[uint64][]*pooled // by contentDigest
}

// pooled is a snapshot of the pool, and how many nodes' feeds use it.
type pooled struct {
	snap   *engine.Snapshot
	digest uint64
	users  int
}

var poolSeed = maphash.MakeSeed()

// share returns the pooled snapshot equal to s (s, pooled now, when there is none) with one more
// user, and lets go of last (nil: none), the user's snapshot until now.
func (p *snapPool) share(s *engine.Snapshot, last *pooled) *pooled {
	d := contentDigest(s)
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.IndexFunc(p.by[d], func(c *pooled) bool { return sameContent(c.snap, s) })
	var got *pooled
	if i >= 0 {
		got = p.by[d][i]
	} else {
		got = &pooled{snap: s, digest: d}
		p.by[d] = append(p.by[d], got)
	}
	got.users++
	p.releaseLocked(last)
	return got
}

// release lets go of x (nil: nothing).
func (p *snapPool) release(x *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(x)
}

func (p *snapPool) releaseLocked(x *pooled) {
	if x == nil {
		return
	}
	if x.users--; x.users > 0 {
		return
	}
	if rest := slices.DeleteFunc(p.by[x.digest], func(c *pooled) bool { return c == x }); len(rest) > 0 {
		p.by[x.digest] = rest
	} else {
		delete(p.by, x.digest)
	}
}

// contentDigest hashes s's types and the identity of their entries (the guard makes one entry a
// resource version, whatever the nodes that get it).
func contentDigest(s *engine.Snapshot) uint64 {
	var d uint64
	for _, t := range s.Types() {
		h := maphash.String(poolSeed, t)
		for _, e := range s.Type(t) {
			h ^= maphash.Comparable(poolSeed, e)
		}
		d = d*31 + h
	}
	return d
}

// sameContent reports whether a and b have the same types, each with the same entries.
func sameContent(a, b *engine.Snapshot) bool {
	ta := a.Types()
	if !slices.Equal(ta, b.Types()) {
		return false
	}
	for _, t := range ta {
		ea, eb := a.Type(t), b.Type(t)
		if len(ea) != len(eb) {
			return false
		}
		for n, e := range ea {
			if eb[n] != e {
				return false
			}
		}
	}
	return true
}

package guard

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync"

	"github.com/kds-host/kds-host/engine"
)

// snapPool shares one engine snapshot among the nodes of a per-node cache whose answers made
// equal ones (the same entries, by type): the engine makes a snapshot's name orders, encodings
// and reference index once, so the nodes of one configuration cost that once, not once each.
type snapPool struct {
	mu    sync.Mutex           // guards by, steps and the users of what they hold
	by    map[uint64][]*pooled // by contentDigest
	steps map[*pooled][]step   // from a pooled snapshot, the last few answers applied to it (feed.apply)
}

// step is an answer of one type, applied as the type's whole content, and the pooled snapshot
// it made.
type step struct {
	typeURL string
	entries []*engine.Entry // in name order
	to      *pooled
}

// maxSteps bounds the steps remembered from a pooled snapshot; one configuration's nodes take few.
const maxSteps = 4

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
	if i < 0 {
		i = len(p.by[d])
		p.by[d] = append(p.by[d], &pooled{snap: s, digest: d})
	}
	got := p.by[d][i]
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
	delete(p.steps, x)
	if rest := slices.DeleteFunc(p.by[x.digest], func(c *pooled) bool { return c == x }); len(rest) > 0 {
		p.by[x.digest] = rest
	} else {
		delete(p.by, x.digest)
	}
}

// stepped returns, with one more user, the pooled snapshot another node's feed made by applying
// entries (in name order) of typeURL to from, and lets go of from; nil if none did.
func (p *snapPool) stepped(from *pooled, typeURL string, entries []*engine.Entry) *pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.steps[from] {
		if st.typeURL == typeURL && st.to.users > 0 && slices.Equal(st.entries, entries) {
			st.to.users++
			p.releaseLocked(from)
			return st.to
		}
	}
	return nil
}

// took remembers that applying entries (in name order) of typeURL to from made to.
func (p *snapPool) took(from *pooled, typeURL string, entries []*engine.Entry, to *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if from.users == 0 {
		return // no longer pooled: no node takes a step from it
	}
	steps := p.steps[from]
	if len(steps) >= maxSteps {
		steps = slices.Delete(steps, 0, 1)
	}
	p.steps[from] = append(steps, step{typeURL, entries, to})
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
		if !maps.Equal(a.Type(t), b.Type(t)) {
			return false
		}
	}
	return true
}

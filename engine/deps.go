package engine

import (
	"slices"
	"sync"
	"sync/atomic"
)

// deps is a snapshot's index of what references each Ref (Snapshot.dependents), made on first
// use. A snapshot derived by Update from one with an index, by few changes, answers from that
// ancestor's index and the names changed since instead of making its own.
type deps struct {
	once sync.Once
	full atomic.Pointer[map[Ref][]*Entry] // this snapshot's own index, once made

	anc   map[Ref][]*Entry // an ancestor's index (nil: none; the snapshot makes its own)
	since []Ref            // the names changed since that ancestor (duplicates allowed)

	sinceOnce sync.Once
	sinceDeps map[Ref][]*Entry // since's current entries by what they reference
	sinceSet  map[Ref]bool
}

// maxSince bounds the names changed since an ancestor's index that a snapshot reads it with.
const maxSince = 64

// derive sets d, of a snapshot derived by changed (type URL -> names) from the one of from.
func (d *deps) derive(from *deps, changed map[string][]string) {
	var since []Ref
	if full := from.full.Load(); full != nil {
		d.anc = *full
	} else if d.anc, since = from.anc, slices.Clip(from.since); d.anc == nil {
		return
	}
	for typeURL, names := range changed {
		for _, name := range names {
			if len(since) == maxSince {
				d.anc = nil
				return
			}
			since = append(since, Ref{TypeURL: typeURL, Name: name})
		}
	}
	d.since = since
}

// dependents is what references r in the snapshot.
func (s *Snapshot) dependents(r Ref) []*Entry {
	if s == nil {
		return nil
	}
	d := &s.deps
	if d.full.Load() != nil || d.anc == nil {
		return (*s.index())[r]
	}
	d.sinceOnce.Do(func() {
		d.sinceDeps, d.sinceSet = map[Ref][]*Entry{}, make(map[Ref]bool, len(d.since))
		for _, k := range d.since {
			if d.sinceSet[k] {
				continue
			}
			d.sinceSet[k] = true
			if e := s.kinds[k.TypeURL][k.Name]; e != nil {
				for _, ref := range e.Refs {
					if by := d.sinceDeps[ref]; len(by) == 0 || by[len(by)-1] != e {
						d.sinceDeps[ref] = append(by, e)
					}
				}
			}
		}
	})
	var out []*Entry
	for _, e := range d.anc[r] {
		if !d.sinceSet[Ref{TypeURL: e.TypeURL, Name: e.Name}] {
			out = append(out, e) // unchanged since the ancestor
		}
	}
	return append(out, d.sinceDeps[r]...)
}

// index is the snapshot's own index of what references each Ref, made once.
func (s *Snapshot) index() *map[Ref][]*Entry {
	s.deps.once.Do(func() {
		m := map[Ref][]*Entry{}
		for _, byName := range s.kinds {
			for _, e := range byName {
				for _, ref := range e.Refs {
					m[ref] = append(m[ref], e)
				}
			}
		}
		s.deps.full.Store(&m)
	})
	return s.deps.full.Load()
}

package engine

import (
	"fmt"
	"slices"
	"strings"
)

// Withholder decides what a client must not get yet: a version whose references the client lacks,
// a name no longer served that what the client holds references. Its methods are called under the
// stream's lock, of the names an evaluation looks at; they read the client through c and must not
// block. What waits is looked at again when the client accepts what it references.
type Withholder interface {
	// Withhold says why the client must not get e now ("": it may), and may give an entry to send
	// instead (one that makes the client ask for what e waits for).
	Withhold(c ClientView, e *Entry) (why string, instead *Entry)
	// Keep says why the client keeps name of typeURL, no longer served ("": it is removed).
	Keep(c ClientView, typeURL, name string) string
}

// ClientView is what a Withholder reads of one client stream.
type ClientView interface {
	Holds(typeURL, name string) (version string, ok bool)  // the version the client accepted, if any
	HeldEntry(typeURL, name string) *Entry                 // the entry of the version it holds: served, or delivered (nil: neither)
	Asks(typeURL, name string) bool                        // the client asks for it (false for a type never asked for)
	AsksType(typeURL string) bool                          // the client asked for typeURL at all
	AsksAll(typeURL string) bool                           // the client asks for every resource of typeURL (wildcard)
	Refused(typeURL, name string) (reason string, ok bool) // the reason of the client's last refusal of it, if any
	Served(typeURL, name string) *Entry                    // the entry served now (nil: none)
	ReferencedBy(typeURL, name string) string              // an entry the client holds that references it, or ""
}

// SetWithholder installs w (nil: none); call it before serving.
func (c *Cache) SetWithholder(w Withholder) { c.withholder = w }

// sessionView is a Session as a Withholder reads it, under its lock.
type sessionView struct {
	s    *Session
	snap *Snapshot
}

func (v sessionView) Holds(typeURL, name string) (string, bool) {
	h := v.s.ackedLocked(typeURL, name)
	return h.version, h.ok
}

func (v sessionView) HeldEntry(typeURL, name string) *Entry {
	h := v.s.ackedLocked(typeURL, name)
	if !h.ok {
		return nil
	}
	if e := v.snap.Type(typeURL)[name]; e != nil && e.Version == h.version {
		return e
	}
	// A version no longer served: what was delivered, if the client took it.
	if ks := v.s.kinds.get(v.s.cache, typeURL); ks != nil {
		if d, ok := ks.delivered.get(name); ok && d.Version == h.version && d.Resource != nil {
			return &Entry{TypeURL: typeURL, Name: name, Version: d.Version, Any: d.Resource, Wire: d, Refs: ks.acceptedRefs[name]}
		}
	}
	return nil
}

func (v sessionView) Asks(typeURL, name string) bool {
	ks := v.s.kinds.get(v.s.cache, typeURL)
	if ks == nil || ks.sub == nil {
		return false
	}
	_, ok := ks.sub.SubscribedResources()[name]
	return ok || ks.sub.IsWildcard()
}

// Asks reports whether the client asks for the resource (type URL, name), as of its last request
// of the type; known with a Withholder or views (Cache.UseViews) only, else false.
func (s *Session) Asks(typeURL, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sessionView{s: s}.Asks(typeURL, name)
}

func (v sessionView) AsksType(typeURL string) bool {
	ks := v.s.kinds.get(v.s.cache, typeURL)
	return ks != nil && ks.requested
}

func (v sessionView) AsksAll(typeURL string) bool {
	ks := v.s.kinds.get(v.s.cache, typeURL)
	return ks != nil && ks.sub != nil && ks.sub.IsWildcard()
}

func (v sessionView) Refused(typeURL, name string) (string, bool) {
	ks := v.s.kinds.get(v.s.cache, typeURL)
	if ks == nil {
		return "", false
	}
	for _, r := range ks.rejected {
		if r.Name == name {
			return r.Reason, true
		}
	}
	if _, ok := ks.refused[name]; ok {
		return "refused", true
	}
	return "", false
}

func (v sessionView) Served(typeURL, name string) *Entry { return v.snap.Type(typeURL)[name] }

func (v sessionView) ReferencedBy(typeURL, name string) string {
	ref := Ref{TypeURL: typeURL, Name: name}
	for _, by := range v.snap.dependents(ref) {
		if ver, ok := v.Holds(by.TypeURL, by.Name); ok && ver == by.Version {
			return fmt.Sprintf("%s %q", shortType(by.TypeURL), by.Name)
		}
	}
	// A version no longer served that the client holds may reference it too (acceptedRefs records
	// those that reference something); only names that may differ from snap are looked at.
	var found string
	v.s.kinds.each(func(ks *kindState) {
		if found != "" || len(ks.acceptedRefs) == 0 {
			return
		}
		look := func(n string) {
			if found != "" || !slices.Contains(ks.acceptedRefs[n], ref) {
				return
			}
			if h := v.s.ackedLocked(ks.name, n); h.ok {
				if e := v.snap.Type(ks.name)[n]; e == nil || e.Version != h.version {
					found = fmt.Sprintf("%s %q", shortType(ks.name), n)
				}
			}
		}
		if !v.s.eachMaybeUnserved(ks, v.snap, look) {
			for n := range ks.acceptedRefs {
				look(n)
			}
		}
	})
	return found
}

// eachMaybeUnserved calls f (perhaps more than once a name) with every name of ks whose ACKed
// version may differ from snap's: delivered's own, its base's changed since, refused, in flight.
// It reports false, calling nothing, when it cannot tell which base names changed. Call with s.mu.
func (s *Session) eachMaybeUnserved(ks *kindState, snap *Snapshot, f func(string)) bool {
	d := &ks.delivered
	var changed []string
	if d.base != nil && d.snap != snap {
		byType, ok := snap.ChangesFrom(d.snap)
		if !ok {
			return false
		}
		changed = byType[ks.name]
	}
	for n := range d.over {
		f(n)
	}
	for _, n := range changed {
		f(n)
	}
	for n := range ks.refused {
		f(n)
	}
	for _, r := range s.inflight {
		if r.kind == ks.name {
			eachName(r.resp, f)
		}
	}
	return true
}

// acceptedLocked, after the client answered r (ACK or NACK), marks dirty the entries that
// reference the names r carried, two levels up, and the names kept, and evaluates their types.
// Call with s.mu, with a Withholder installed.
func (s *Session) acceptedLocked(r *inflight) {
	typeURL, snap := r.kind, s.snapshot()
	if ks := s.kinds.get(s.cache, typeURL); ks != nil {
		entries := snap.Type(typeURL)
		eachName(r.resp, func(n string) {
			e := entries[n]
			if _, had := ks.acceptedRefs[n]; !had && (e == nil || len(e.Refs) == 0) {
				return // it references nothing, as far as the session knows: nothing to record
			}
			switch h := s.ackedLocked(typeURL, n); {
			case !h.ok, e != nil && e.Version == h.version && len(e.Refs) == 0:
				delete(ks.acceptedRefs, n)
			case e != nil && e.Version == h.version:
				if ks.acceptedRefs == nil {
					ks.acceptedRefs = map[string][]Ref{}
				}
				ks.acceptedRefs[n] = e.Refs
			}
		})
	}
	touched := map[*kindState]bool{}
	var mark func(ref Ref, depth int)
	mark = func(ref Ref, depth int) {
		for _, e := range snap.dependents(ref) {
			ks := s.kinds.get(s.cache, e.TypeURL)
			if ks == nil {
				continue
			}
			ks.markDirty(e.Name)
			touched[ks] = true
			if depth > 0 {
				mark(Ref{TypeURL: e.TypeURL, Name: e.Name}, depth-1)
			}
		}
	}
	eachName(r.resp, func(n string) { mark(Ref{TypeURL: typeURL, Name: n}, 1) })
	s.kinds.each(func(ks *kindState) {
		for n := range ks.kept {
			ks.markDirty(n)
			touched[ks] = true
		}
	})
	for ks := range touched {
		s.cache.evaluateLocked(s, ks, nil)
	}
}

func shortType(typeURL string) string { return typeURL[strings.LastIndexAny(typeURL, "./")+1:] }

// Hold is a version a client does not get now, and why.
type Hold struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"` // "" for a name kept although no longer served
	Reason  string `json:"reason"`
}

func (ks *kindState) hold(name, version, why string) {
	if ks.holds == nil {
		ks.holds = map[string]Hold{}
	}
	ks.holds[name] = Hold{Name: name, Version: version, Reason: why}
}

func (ks *kindState) unhold(name string) { delete(ks.holds, name) }

// keep records that name, no longer served, is kept.
func (ks *kindState) keep(name, why string) {
	if ks.kept == nil {
		ks.kept = map[string]string{}
	}
	ks.kept[name] = why
	ks.hold(name, "", why)
}

package engine

// Reference holds: a Withholder keeps a version from a client while what it references is not
// with the client (make-before-break), and keeps a name no longer served while what the client
// holds still references it. The cache asks it under the stream's lock, of the names an
// evaluation looks at; an answer that may change when the client accepts something is looked at
// again when it does (the entries that reference what it accepted, two levels up).

import (
	"fmt"
	"slices"
)

// Withholder decides what a client must not get yet. Its methods are called with the stream's
// lock held: they read the client through c and must not block.
type Withholder interface {
	// Withhold says why the client must not get e now ("": it may), and may give instead an
	// entry to send in e's place (a version of what the client holds that makes it ask for
	// what e waits for).
	Withhold(c ClientView, e *Entry) (why string, instead *Entry)
	// Keep says why the client keeps name of typeURL, which is no longer served ("": it is
	// removed).
	Keep(c ClientView, typeURL, name string) string
}

// ClientView is what a Withholder reads of one client stream.
type ClientView interface {
	// Holds is the version of typeURL/name the client has accepted, if any.
	Holds(typeURL, name string) (version string, ok bool)
	// HeldEntry is the entry of what the client holds of typeURL/name: the one served now, or
	// the one it was delivered (nil when neither is the version it holds).
	HeldEntry(typeURL, name string) *Entry
	// Asks reports whether the client asks for typeURL/name (false for a type it never asked
	// for).
	Asks(typeURL, name string) bool
	// AsksType reports whether the client asked for typeURL at all; AsksAll whether it asks for
	// every resource of it (a wildcard subscription).
	AsksType(typeURL string) bool
	AsksAll(typeURL string) bool
	// Refused is the reason the client gave when it last refused typeURL/name, if it did.
	Refused(typeURL, name string) (reason string, ok bool)
	// Served is the entry served now of typeURL/name (nil: none).
	Served(typeURL, name string) *Entry
	// ReferencedBy names an entry the client holds that references typeURL/name, or "".
	ReferencedBy(typeURL, name string) string
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
	// A version no longer served: what was delivered, when the client took it.
	ks := v.s.kinds.get(v.s.cache, typeURL)
	if ks == nil {
		return nil
	}
	if d, ok := ks.delivered.get(name); ok && d.Version == h.version && d.Resource != nil {
		return &Entry{TypeURL: typeURL, Name: name, Version: d.Version, Any: d.Resource, Wire: d, Refs: ks.acceptedRefs[name]}
	}
	return nil
}

func (v sessionView) Asks(typeURL, name string) bool {
	ks := v.s.kinds.get(v.s.cache, typeURL)
	if ks == nil || ks.sub == nil {
		return false
	}
	if ks.sub.IsWildcard() {
		return true
	}
	_, ok := ks.sub.SubscribedResources()[name]
	return ok
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
	for _, by := range v.snap.dependents(Ref{TypeURL: typeURL, Name: name}) {
		if ver, ok := v.Holds(by.TypeURL, by.Name); ok && ver == by.Version {
			return fmt.Sprintf("%s %q", shortType(by.TypeURL), by.Name)
		}
	}
	// What the client holds of a version no longer served may reference it too.
	var found string
	v.s.kinds.each(func(ks *kindState) {
		if found != "" {
			return
		}
		v.s.eachAckedLocked(ks.name, func(n, ver string) {
			if found != "" {
				return
			}
			if e := v.snap.Type(ks.name)[n]; e == nil || e.Version != ver {
				if held := ks.acceptedRefs[n]; slices.Contains(held, Ref{TypeURL: typeURL, Name: name}) {
					found = fmt.Sprintf("%s %q", shortType(ks.name), n)
				}
			}
		})
	})
	return found
}

// acceptedLocked marks dirty, after the client accepted names of typeURL, the entries that
// reference them and those that reference those, and evaluates their types: a version held
// back for them may go now. Call with s.mu, with a Withholder installed.
func (s *Session) acceptedLocked(typeURL string, names []string) {
	snap := s.snapshot()
	if ks := s.kinds.get(s.cache, typeURL); ks != nil {
		entries := snap.Type(typeURL)
		for _, n := range names {
			e := entries[n]
			if _, had := ks.acceptedRefs[n]; !had && (e == nil || len(e.Refs) == 0) {
				continue // it references nothing, as far as the session knows: nothing to record
			}
			switch h := s.ackedLocked(typeURL, n); {
			case !h.ok:
				delete(ks.acceptedRefs, n)
			case e != nil && e.Version == h.version && len(e.Refs) == 0:
				delete(ks.acceptedRefs, n)
			case e != nil && e.Version == h.version:
				if ks.acceptedRefs == nil {
					ks.acceptedRefs = map[string][]Ref{}
				}
				ks.acceptedRefs[n] = e.Refs
			}
		}
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
	for _, n := range names {
		mark(Ref{TypeURL: typeURL, Name: n}, 1)
	}
	// A name kept because something referenced it may go once the client holds what no longer
	// does.
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

func shortType(typeURL string) string {
	for i := len(typeURL) - 1; i >= 0; i-- {
		if typeURL[i] == '.' || typeURL[i] == '/' {
			return typeURL[i+1:]
		}
	}
	return typeURL
}

// Hold is a version a client does not get now, and why.
type Hold struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"` // "" for a name kept although no longer served
	Reason  string `json:"reason"`
}

// hold records that name's version is held back, and why.
func (ks *kindState) hold(name, version, why string) {
	if ks.holds == nil {
		ks.holds = map[string]Hold{}
	}
	ks.holds[name] = Hold{Name: name, Version: version, Reason: why}
}

func (ks *kindState) unhold(name string) {
	if len(ks.holds) > 0 {
		delete(ks.holds, name)
	}
}

// keep records that name, no longer served, is kept, and why.
func (ks *kindState) keep(name, why string) {
	if ks.kept == nil {
		ks.kept = map[string]string{}
	}
	ks.kept[name] = why
	ks.hold(name, "", why)
}

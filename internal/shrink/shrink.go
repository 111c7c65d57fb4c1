// Package shrink gives back the memory of maps that were large once: a Go map keeps its buckets
// after its entries are deleted, so a table that once held 2,000 clients would hold their memory
// for as long as it lives.
package shrink

import "maps"

// Peak is the most entries a map held since it was last copied. The zero value is ready.
type Peak struct{ n int }

// minPeak is the size below which a map is not worth copying.
const minPeak = 64

// Map returns m, or a right-sized copy of it once it holds under a quarter of its peak. Call it
// after deleting from m, and keep what it returns.
func Map[K comparable, V any](m map[K]V, p *Peak) map[K]V {
	if l := len(m); l > p.n {
		p.n = l
		return m
	}
	if p.n < minPeak || len(m) >= p.n/4 {
		return m
	}
	p.n = len(m)
	c := maps.Clone(m)
	if c == nil {
		c = map[K]V{}
	}
	return c
}

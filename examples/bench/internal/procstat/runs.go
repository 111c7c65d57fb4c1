package procstat

import (
	"fmt"
	"slices"
	"strings"
)

// RunOrder is run r's jobs (r from 1): the blocks in their order, each one's jobs rotated by
// r-1. What a server's run leaves on the machine (memory to give back, a busy spell) weighs on
// the next one: rotated, it weighs on each server in turn.
func RunOrder[J any](blocks [][]J, r int) []J {
	var out []J
	for _, b := range blocks {
		for i := range b {
			out = append(out, b[(i+r-1)%len(b)])
		}
	}
	return out
}

// ParseList reads a comma list of names, each one of known.
func ParseList[T ~string](s string, known []T) ([]T, error) {
	var out []T
	for _, part := range strings.Split(s, ",") {
		v := T(strings.TrimSpace(part))
		if !slices.Contains(known, v) {
			names := make([]string, len(known))
			for i, k := range known {
				names[i] = string(k)
			}
			return nil, fmt.Errorf("%q: want %s", part, strings.Join(names, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

package main

import (
	"fmt"
	"slices"
	"testing"
)

// Each run starts a scenario's servers one further along, and keeps the scenarios in order.
func TestRunsRotateTheServers(t *testing.T) {
	a, b := scenario{Zones: 100, Resources: 10}, scenario{Zones: 1000, Resources: 10}
	blocks := [][]job{
		{{a, "holds-on"}, {a, "floor"}, {a, "stock"}},
		{{b, "holds-on"}, {b, "stock"}},
	}
	names := func(js []job) []string {
		var out []string
		for _, j := range js {
			out = append(out, fmt.Sprintf("%d/%s", j.sc.Zones, j.sv))
		}
		return out
	}
	for r, want := range map[int][]string{
		1: {"100/holds-on", "100/floor", "100/stock", "1000/holds-on", "1000/stock"},
		2: {"100/floor", "100/stock", "100/holds-on", "1000/stock", "1000/holds-on"},
		3: {"100/stock", "100/holds-on", "100/floor", "1000/holds-on", "1000/stock"},
		4: {"100/holds-on", "100/floor", "100/stock", "1000/stock", "1000/holds-on"},
	} {
		if got := names(runOrder(blocks, r)); !slices.Equal(got, want) {
			t.Errorf("run %d: %v, want %v", r, got, want)
		}
	}
}

package main

// What a run found, the checks that failed and the table it prints.

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// report is what a run found.
type report struct {
	cfg                 config
	faults              map[string]int
	acked, ambiguous    int
	refused             int
	probe               int // of acked, the latency probe's
	lost, duplicated    []string
	mismatched          []string
	converge            []time.Duration // per zone, after the last fault
	restarts            map[string]int
	resources           int
	checked, unsure     int // names whose every write was answered, and the others
	notConverged        bool
	convergenceDeadline time.Duration
	latency             [phases]latencySamples
	slow                slowStats
	bad                 badStats
	unfixed             []string // bad rows still broken after the heal
}

// problems are the checks that failed.
func (r *report) problems() []string {
	var out []string
	if len(r.lost) > 0 {
		out = append(out, fmt.Sprintf("%d acknowledged writes lost: %s", len(r.lost), strings.Join(r.lost[:min(5, len(r.lost))], "; ")))
	}
	if len(r.duplicated) > 0 {
		out = append(out, fmt.Sprintf("%d names listed twice: %v", len(r.duplicated), r.duplicated))
	}
	if r.notConverged {
		out = append(out, fmt.Sprintf("zones not equal to the global %s after the last fault: %s", r.convergenceDeadline, strings.Join(r.mismatched, " | ")))
	}
	if len(r.unfixed) > 0 {
		out = append(out, fmt.Sprintf("bad rows still broken after the heal: %v", r.unfixed))
	}
	return out
}

// table is the run's summary.
func (r *report) table() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "chaos: %s of faults, seed %d, %d replicas on one PostgreSQL, %d zones\n\n", r.cfg.Duration, r.cfg.Seed, replicas, r.cfg.Zones)
	fmt.Fprintf(&b, "%-20s %s\n", "fault", "count")
	total := 0
	for _, k := range faultKinds {
		fmt.Fprintf(&b, "%-20s %d\n", k, r.faults[k])
		total += r.faults[k]
	}
	fmt.Fprintf(&b, "%-20s %d\n\n", "all", total)
	fmt.Fprintf(&b, "%-34s %d (of which the latency probe's %d)\n", "writes acknowledged", r.acked, r.probe)
	fmt.Fprintf(&b, "%-34s %d\n", "writes refused (not applied)", r.refused)
	fmt.Fprintf(&b, "%-34s %d\n", "writes unanswered (either way)", r.ambiguous)
	fmt.Fprintf(&b, "%-34s %d\n", "MeshTimeouts in the global", r.resources)
	fmt.Fprintf(&b, "%-34s %d (and %d with an unanswered write, checked for agreement only)\n", "names checked against their writes", r.checked, r.unsure)
	fmt.Fprintf(&b, "%-34s %d\n", "acknowledged writes lost", len(r.lost))
	fmt.Fprintf(&b, "%-34s %d\n", "duplicated", len(r.duplicated))
	if len(r.converge) > 0 {
		c := slices.Clone(r.converge)
		slices.Sort(c)
		fmt.Fprintf(&b, "%-34s p50 %s, max %s\n", "convergence after the last fault", c[(len(c)-1)/2].Round(time.Millisecond), c[len(c)-1].Round(time.Millisecond))
	}

	fmt.Fprintf(&b, "\nhealthy-zone write latency (acknowledged write to a zone holding it, each zone not under a fault of its own)\n")
	var without latencySamples
	for p := range phases {
		if p != slowZonesPresent {
			without.add(r.latency[p])
		}
	}
	fmt.Fprintf(&b, "  %-32s %s\n", "slow zones present", r.latency[slowZonesPresent])
	fmt.Fprintf(&b, "  %-32s %s\n", "no slow zones", without)
	fmt.Fprintf(&b, "  %-32s %s\n", "  of which no fault at all", r.latency[quiet])
	fmt.Fprintf(&b, "  %-32s %s\n", "  of which other faults", r.latency[otherFaults])
	fmt.Fprintf(&b, "  %-32s %s\n", "  of which a bad row present", r.latency[badRowPresent])

	if r.cfg.SlowZones > 0 {
		fmt.Fprintf(&b, "\n%-34s %d (%d a fault, %s each), %d failed to open\n", "slow zones started", r.slow.started, r.cfg.SlowZones*replicas, r.cfg.SlowZoneHold, r.slow.failed)
		ended := 0
		var codes []string
		for _, c := range slices.Sorted(maps.Keys(r.slow.ended)) {
			ended += r.slow.ended[c]
			codes = append(codes, fmt.Sprintf("%-32s %d (%q)", c, r.slow.ended[c], r.slow.reasons[c]))
		}
		fmt.Fprintf(&b, "%-34s %d\n", "slow zones ended by the global", ended)
		for _, c := range codes {
			fmt.Fprintf(&b, "  %s\n", c)
		}
		fmt.Fprintf(&b, "%-34s %d\n", "slow zones open when they left", r.slow.open)
	}
	if r.cfg.BadRows {
		fmt.Fprintf(&b, "\n%-34s %d (labels of an existing row %d, owners of an inserted row %d)\n", "bad rows injected", r.bad.labels+r.bad.owners, r.bad.labels, r.bad.owners)
		fmt.Fprintf(&b, "%-34s %d (by an API write %d, repaired in SQL first %d), %d left broken\n", "bad rows fixed", r.bad.byAPI+r.bad.bySQL, r.bad.byAPI, r.bad.bySQL, len(r.unfixed))
	}

	names := make([]string, 0, len(r.restarts))
	for n := range r.restarts {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(&b, "\n%-10s %s\n", "process", "restarts")
	for _, n := range names {
		fmt.Fprintf(&b, "%-10s %d\n", n, r.restarts[n])
	}
	return b.String()
}

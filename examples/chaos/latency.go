package main

// How long a write takes to reach a healthy zone. A probe writes one MeshTimeout every
// probeEvery through the replicas' API, each time with the next sequence number, and polls every
// zone for it; each acknowledged write's wait for each zone (until the zone holds it or a newer
// one) is filed under what the soak did meanwhile (slow zones present, a bad row present,
// another fault, nothing), and dropped when a fault of that zone's own (its process, its
// connections) overlaps it.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// probeName is the MeshTimeout the probe writes; its acknowledged writes are checked as any.
	probeName = "probe"
	// probeWait is how long a zone is waited for; a zone that has not got the write by then is
	// counted at probeWait (and as late).
	probeWait = 30 * time.Second
	// The probe writes every probeEvery, and each zone is polled every probePoll.
	probeEvery = 250 * time.Millisecond
	probePoll  = 25 * time.Millisecond
	// A zone's own fault spoils its waits until ownGrace after it heals (a killed zone starts
	// and connects again); any other fault counts as present until faultGrace after it heals.
	ownGrace   = 10 * time.Second
	faultGrace = 2 * time.Second
)

// phase is what the soak did while a write travelled to a zone.
type phase int

const (
	quiet phase = iota
	otherFaults
	badRowPresent
	slowZonesPresent
	phases
)

// interval is the time of one fault: zone is the zone it targets, -1 when it reaches every zone;
// end is zero while it lasts.
type interval struct {
	kind       string
	zone       int
	start, end time.Time
}

// latencySamples are the waits of one phase.
type latencySamples struct {
	waits []time.Duration
	late  int // waits cut at probeWait
}

func (l *latencySamples) add(o latencySamples) {
	l.waits = append(l.waits, o.waits...)
	l.late += o.late
}

// String is "p50 X, p99 Y, max Z (N waits, L past 30s)", or "no waits".
func (l latencySamples) String() string {
	if len(l.waits) == 0 {
		return "no waits"
	}
	w := slices.Sorted(slices.Values(l.waits))
	return fmt.Sprintf("p50 %s, p99 %s, max %s (%d waits, %d past %s)", quantile(w, 0.50), quantile(w, 0.99),
		w[len(w)-1].Round(time.Millisecond), len(w), l.late, probeWait)
}

// quantile is the nearest-rank q-quantile of sorted, rounded to the millisecond.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))].Round(time.Millisecond)
}

// begin records that a fault of kind starts now (zone -1: every zone), and counts it.
func (s *soak) begin(kind string, zone int) *interval {
	iv := &interval{kind: kind, zone: zone, start: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[kind]++
	s.intervals = append(s.intervals, iv)
	return iv
}

// finish records that the fault iv has healed.
func (s *soak) finish(iv *interval) {
	s.mu.Lock()
	defer s.mu.Unlock()
	iv.end = time.Now()
}

// classify says under what the wait of zone j from from to to falls, or false when a fault of
// zone j's own overlaps it. Call it with s.mu held.
func (s *soak) classify(j int, from, to time.Time) (phase, bool) {
	p := quiet
	for _, iv := range s.intervals {
		grace := faultGrace
		if iv.zone == j {
			grace = ownGrace
		}
		if iv.kind == "slow zones" {
			grace = 0 // present exactly while they are
		}
		if iv.start.After(to) || (!iv.end.IsZero() && iv.end.Add(grace).Before(from)) {
			continue
		}
		switch {
		case iv.zone == j:
			return 0, false
		case iv.kind == "slow zones":
			p = max(p, slowZonesPresent)
		case iv.kind == "bad row":
			p = max(p, badRowPresent)
		case iv.zone >= 0: // another zone's fault: this one is not touched by it
		default:
			p = max(p, otherFaults)
		}
	}
	return p, true
}

// probeWrite is an acknowledged write of the probe: its sequence number (its timeout, in
// milliseconds) and when its answer came.
type probeWrite struct {
	seq   int
	acked time.Time
}

// probeWaits are the probe's writes a zone has not been seen to hold yet.
type probeWaits struct {
	mu      sync.Mutex
	pending []probeWrite // in sequence order
}

// probe writes the probe MeshTimeout every probeEvery through the replicas in turn, each time
// with the next sequence number, and has a watcher a zone poll it; it returns when ctx has ended
// and every watcher is done.
func (s *soak) probe(ctx context.Context) {
	waits := make([]*probeWaits, len(s.zones))
	written := make(chan struct{})
	var watchers sync.WaitGroup
	for j := range waits {
		waits[j] = &probeWaits{}
		watchers.Go(func() { s.watch(j, waits[j], written) })
	}
	for seq := 1; ctx.Err() == nil; seq++ {
		value := fmt.Sprintf("%dms", seq)
		o, _ := s.call(http.MethodPut, s.api(seq%replicas), "/meshes/default/meshtimeouts/"+probeName, timeoutDoc(probeName, value))
		s.record(probeName, value, true, o)
		if o == applied {
			s.mu.Lock()
			s.writes.probe++
			s.mu.Unlock()
			w := probeWrite{seq: seq, acked: time.Now()}
			for _, pw := range waits {
				pw.mu.Lock()
				pw.pending = append(pw.pending, w)
				pw.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(probeEvery):
		}
	}
	close(written)
	watchers.Wait()
}

// watch polls zone j for the probe and files the wait of every pending write the zone holds
// (or a newer one of): each until probeWait at most, none that a fault of the zone's own
// overlaps. It returns once written is closed and nothing is pending.
func (s *soak) watch(j int, pw *probeWaits, written <-chan struct{}) {
	for {
		seen := s.probeSeen(j)
		now := time.Now()
		pw.mu.Lock()
		var keep []probeWrite
		s.mu.Lock()
		for _, w := range pw.pending {
			p, ok := s.classify(j, w.acked, now)
			switch {
			case !ok: // the zone's own fault: its wait says nothing of the others'
			case w.seq <= seen:
				s.latency[p].waits = append(s.latency[p].waits, now.Sub(w.acked))
			case now.Sub(w.acked) > probeWait:
				s.latency[p].waits = append(s.latency[p].waits, probeWait)
				s.latency[p].late++
			default:
				keep = append(keep, w)
			}
		}
		s.mu.Unlock()
		pw.pending = keep
		pw.mu.Unlock()
		select {
		case <-written:
			if len(keep) == 0 {
				return
			}
		default:
		}
		time.Sleep(probePoll)
	}
}

// probeSeen is the sequence number of the probe zone j holds, 0 when it holds none or does not
// answer.
func (s *soak) probeSeen(j int) int {
	o, b := s.call(http.MethodGet, s.zoneAPI(j), "/meshes/default/meshtimeouts/"+probeName, "")
	if o != applied {
		return 0
	}
	var got stored
	if json.Unmarshal(b, &got) != nil {
		return 0
	}
	seq, err := strconv.Atoi(strings.TrimSuffix(got.Spec.Default.ConnectionTimeout, "ms"))
	if err != nil {
		return 0
	}
	return seq
}

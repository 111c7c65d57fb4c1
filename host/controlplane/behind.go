package controlplane

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/engine"
)

// Why a zone lacks a name the global serves (kds_zone_behind_resources's reason label), in the
// order a name that is several is counted under.
const (
	behindWithheld = "withheld" // owner holds keep it from the zone
	behindParked   = "parked"   // the zone refused it as invalid; not resent until it changes
	behindGivenUp  = "given_up" // the zone refused it and the retry policy gave up on the stream
	behindMissing  = "missing"  // any other: in flight, refused and being retried
)

// zoneLag is how far behind the global each zone connected to this replica is: per zone, kind
// and reason, the names the snapshot serves that the zone has not ACKed at the version served.
// It is computed on its own schedule (run), and a scrape serves the last result.
type zoneLag struct {
	g *Global

	mu   sync.Mutex // guards last
	last []lagRow

	// acked, owned by run's goroutine, keeps by zone what a computation of it read, for as long
	// as the stream, what the zone ACKed and the snapshot are the same: a zone in sync costs
	// two reads of its session.
	acked map[string]ackedCount
}

// lagRow is one series of kds_zone_behind_resources.
type lagRow struct {
	zone, kind, reason string
	names              int
}

// ackedCount is, per kind, how many names a zone ACKed at the version a snapshot serves.
type ackedCount struct {
	stream int64
	digest engine.Digest
	snap   *engine.Snapshot
	counts []int // by kind, in the order of snap.Types()
	// rows are the zone's rows as last computed with nothing named (no name withheld, parked or
	// given up); rowsOK says they are, for this stream, digest and snapshot.
	rows   []lagRow
	rowsOK bool
}

var zoneBehindDesc = prometheus.NewDesc("kds_zone_behind_resources",
	"Resources the global serves that a zone connected to this replica does not hold at the version served, by kind and reason: withheld (owner holds keep them back), parked (the zone refused them as invalid; not sent again until they change), given_up (the zone refused them and the retry policy gave up on its stream), missing (any other: on their way, refused and retried). Computed every 5 probe intervals (10s); absent while 0.",
	[]string{"zone", "kind", "reason"}, nil)

func newZoneLag(g *Global) *zoneLag { return &zoneLag{g: g, acked: map[string]ackedCount{}} }

// lagEvery is how many probe intervals apart the lag is computed (10s by default): a computation
// after a write costs every connected zone's names, and KDSZoneBehind waits minutes before it
// fires.
const lagEvery = 5

// run computes the lag every interval until ctx ends.
func (l *zoneLag) run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		rows := l.compute()
		l.mu.Lock()
		l.last = rows
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// compute reads, for every zone connected here, what it lacks of the current snapshot.
func (l *zoneLag) compute() []lagRow {
	g := l.g
	snap := g.Cache.Snapshot()
	if snap == nil {
		return nil
	}
	kinds := snap.Types()
	var rows []lagRow
	seen := map[string]bool{}
	for _, zi := range g.Zones.List() {
		if !zi.Connected {
			continue
		}
		s := g.Cache.Session(zi.Stream)
		if s == nil {
			continue
		}
		seen[zi.Node] = true
		named := l.named(zi.Node, s)
		if c, ok := l.acked[zi.Node]; ok && len(named) == 0 && c.rowsOK && c.stream == zi.Stream && c.snap == snap && c.digest == s.Digest() {
			rows = append(rows, c.rows...) // nothing changed for the zone: an idle fleet costs a lookup a zone
			continue
		}
		zoneRows := len(rows)
		acked := l.ackedOf(zi, s, snap, kinds)
		byKind := map[string]map[string]int{}
		for ref, reason := range named {
			e := snap.Type(ref.TypeURL)[ref.Name]
			if e == nil {
				continue // no longer served
			}
			if v, ok := s.AckedVersion(ref.TypeURL, ref.Name); ok && v == e.Version {
				continue
			}
			if byKind[ref.TypeURL] == nil {
				byKind[ref.TypeURL] = map[string]int{}
			}
			byKind[ref.TypeURL][reason]++
		}
		for i, kind := range kinds {
			reasons := byKind[kind]
			missing := len(snap.Type(kind)) - acked[i]
			for _, reason := range []string{behindWithheld, behindParked, behindGivenUp} {
				if n := reasons[reason]; n > 0 {
					rows = append(rows, lagRow{zi.Node, kind, reason, n})
					missing -= n
				}
			}
			if missing > 0 {
				rows = append(rows, lagRow{zi.Node, kind, behindMissing, missing})
			}
		}
		if c := l.acked[zi.Node]; len(named) == 0 && c.stream == zi.Stream && c.snap == snap {
			c.rows, c.rowsOK = slices.Clone(rows[zoneRows:]), true
			l.acked[zi.Node] = c
		}
	}
	for zone := range l.acked {
		if !seen[zone] {
			delete(l.acked, zone)
		}
	}
	return rows
}

// ackedOf is, for each of kinds (the snapshot's Types), how many names the zone's session has
// ACKed at the snapshot's version.
func (l *zoneLag) ackedOf(zi engine.NodeInsight, s *engine.Session, snap *engine.Snapshot, kinds []string) []int {
	digest := s.Digest() // before the names: an ACK meanwhile changes it, and the next round counts again
	if c, ok := l.acked[zi.Node]; ok && c.stream == zi.Stream && c.digest == digest && c.snap == snap {
		return c.counts
	}
	counts := make([]int, len(kinds))
	for i, kind := range kinds {
		entries, n := snap.Type(kind), 0
		s.Acked([]string{kind}, func(_, name, version string) {
			if e := entries[name]; e != nil && e.Version == version {
				n++
			}
		})
		counts[i] = n
	}
	l.acked[zi.Node] = ackedCount{stream: zi.Stream, digest: digest, snap: snap, counts: counts}
	return counts
}

// named is the names the zone lacks for a reason the global knows: withheld, parked, given up.
// A name that is several is named by the first of these.
func (l *zoneLag) named(zone string, s *engine.Session) map[engine.Ref]string {
	var out map[engine.Ref]string // nil while nothing is named: the common case costs no map
	add := func(ref engine.Ref, reason string) {
		if out == nil {
			out = map[engine.Ref]string{}
		}
		if _, ok := out[ref]; !ok {
			out[ref] = reason
		}
	}
	if l.g.Holds != nil && l.g.Holds.Withholds(zone) {
		for _, w := range l.g.Holds.Withheld(zone) {
			add(w.Key, behindWithheld)
		}
	}
	if l.g.Retry == nil {
		return out
	}
	failing, givenUp := s.Retry().Failing()
	if !failing && !givenUp {
		return out
	}
	st := s.Retry().State()
	if st == nil {
		return out
	}
	for _, ts := range st.Failing {
		for _, p := range ts.Parked {
			add(engine.Ref{TypeURL: ts.TypeURL, Name: p.Name}, behindParked)
		}
	}
	if st.GivenUp != "" {
		for _, ts := range st.Failing {
			for _, name := range ts.Rejected {
				add(engine.Ref{TypeURL: ts.TypeURL, Name: name}, behindGivenUp)
			}
		}
	}
	return out
}

// Describe implements prometheus.Collector.
func (l *zoneLag) Describe(ch chan<- *prometheus.Desc) { ch <- zoneBehindDesc }

// Collect implements prometheus.Collector: the last computation.
func (l *zoneLag) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	rows := l.last
	l.mu.Unlock()
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(zoneBehindDesc, prometheus.GaugeValue, float64(r.names), r.zone, r.kind, r.reason)
	}
}

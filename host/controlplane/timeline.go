package controlplane

import (
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/host/api"
)

// timelineCap is how many events a zone's timeline keeps: the latest, the older ones dropped.
const timelineCap = 200

// timelineDetailMax bounds the text an event keeps of a NACK's detail or a give-up's reason.
const timelineDetailMax = 256

// The types of a timeline event.
const (
	TimelineConnected    = "connected"    // a stream of the zone opened
	TimelineDisconnected = "disconnected" // it closed
	TimelineNACK         = "nack"         // the zone refused (part of) a response of Kind
	TimelineRecovered    = "recovered"    // the first ACK of Kind after its NACKs
	TimelineRound        = "round"        // a retry round fired
	TimelineGaveUp       = "gave-up"      // the retry policy gave up on the stream
)

// TimelineEvent is one event of a zone's timeline, as the status page charts it.
type TimelineEvent struct {
	At   time.Time `json:"at"`
	Type string    `json:"type"`
	Kind string    `json:"kind,omitempty"`
	// Count is, for a NACK, the names it rejected; for a round, the resources it resent.
	Count int `json:"count,omitempty"`
	// Round numbers the rounds since the zone last had no kind failing (as the scheduler's
	// round number resets then); Delay is how long the round waited.
	Round  int            `json:"round,omitempty"`
	Delay  string         `json:"delay,omitempty"`
	Resent map[string]int `json:"resent,omitempty"`
	// Detail is a NACK's error detail or a give-up's reason, cut to 256 bytes.
	Detail string `json:"detail,omitempty"`
}

// TimelineReport is the answer of GET /api/timeline: the latest events of every zone (or of
// the zone ?zone= names), oldest first, and the global's clock, so that a page counts down to
// a next retry against it.
type TimelineReport struct {
	Now   time.Time                  `json:"now"`
	Cap   int                        `json:"cap"`
	Zones map[string][]TimelineEvent `json:"zones"`
}

// timeline keeps, per zone, a ring of its latest events: NACKs and recoveries (from the stream
// events), rounds and give-ups (from the retry scheduler's hooks), connections. A zone's ring
// is created when its stream opens and freed with the zone (forget); a hook for a zone without
// one is dropped, so nothing outlives the zone table.
type timeline struct {
	mu    sync.Mutex // guards zones and every zone's ring
	zones map[string]*zoneTimeline
	// failing counts the zones' failing kinds (changed under mu): while none is, an ACK, which
	// every stream sends on every write, records nothing and takes no lock.
	failing atomic.Int64
}

type zoneTimeline struct {
	ring    []TimelineEvent // grows to timelineCap, then wraps: a quiet zone costs its few events
	next    int             // where the next event goes, once ring is full
	failing map[string]bool // kinds NACKed and not ACKed since
	round   int
}

func newTimeline() *timeline { return &timeline{zones: map[string]*zoneTimeline{}} }

func (z *zoneTimeline) add(e TimelineEvent) {
	if n := timelineDetailMax; len(e.Detail) > n {
		for n > 0 && !utf8.RuneStart(e.Detail[n]) {
			n--
		}
		e.Detail = e.Detail[:n] + "…"
	}
	if len(z.ring) < timelineCap {
		z.ring = append(z.ring, e)
		return
	}
	z.ring[z.next] = e
	z.next = (z.next + 1) % timelineCap
}

func (z *zoneTimeline) events() []TimelineEvent {
	out := make([]TimelineEvent, 0, len(z.ring))
	out = append(out, z.ring[z.next:]...)
	out = append(out, z.ring[:z.next]...)
	return out
}

// record runs f on the zone's ring, if it has one (or create says to make it).
func (t *timeline) record(zone string, create bool, f func(z *zoneTimeline)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	z := t.zones[zone]
	if z == nil {
		if !create {
			return
		}
		z = &zoneTimeline{failing: map[string]bool{}}
		t.zones[zone] = z
	}
	f(z)
}

// observer records what happens on zone streams. It only appends under a lock: it never blocks.
func (t *timeline) observer() event.Observer {
	return event.Observer{
		StreamOpened: func(_ int64, zone string) {
			t.record(zone, true, func(z *zoneTimeline) {
				t.failing.Add(-int64(len(z.failing)))
				clear(z.failing)
				z.round = 0
				z.add(TimelineEvent{At: time.Now(), Type: TimelineConnected})
			})
		},
		StreamClosed: func(_ int64, zone string) {
			t.record(zone, false, func(z *zoneTimeline) { z.add(TimelineEvent{At: time.Now(), Type: TimelineDisconnected}) })
		},
		NACK: func(n event.NACK) {
			t.record(n.Node, false, func(z *zoneTimeline) {
				if !z.failing[n.TypeURL] {
					z.failing[n.TypeURL] = true
					t.failing.Add(1)
				}
				z.add(TimelineEvent{At: time.Now(), Type: TimelineNACK, Kind: n.TypeURL, Count: len(n.Rejected), Detail: n.Detail})
			})
		},
		ACK: func(a event.ACK) {
			if a.Initial || t.failing.Load() == 0 {
				return // (a zone's NACK was counted before its stream's next ACK is heard)
			}
			t.record(a.Node, false, func(z *zoneTimeline) {
				if !z.failing[a.TypeURL] {
					return
				}
				delete(z.failing, a.TypeURL)
				t.failing.Add(-1)
				if len(z.failing) == 0 {
					z.round = 0
				}
				z.add(TimelineEvent{At: time.Now(), Type: TimelineRecovered, Kind: a.TypeURL})
			})
		},
	}
}

// hooks returns next with the rounds and give-ups recorded too.
func (t *timeline) hooks(next retry.Hooks) retry.Hooks {
	h := next
	h.Round = func(zone string, delay time.Duration, resent map[string]int) {
		if next.Round != nil {
			next.Round(zone, delay, resent)
		}
		total := 0
		for _, n := range resent {
			total += n
		}
		t.record(zone, false, func(z *zoneTimeline) {
			z.round++
			z.add(TimelineEvent{At: time.Now(), Type: TimelineRound, Round: z.round, Delay: delay.String(), Count: total, Resent: maps.Clone(resent)})
		})
	}
	h.GaveUp = func(zone, reason string) {
		if next.GaveUp != nil {
			next.GaveUp(zone, reason)
		}
		t.record(zone, false, func(z *zoneTimeline) { z.add(TimelineEvent{At: time.Now(), Type: TimelineGaveUp, Detail: reason}) })
	}
	return h
}

// forget frees a zone's timeline.
func (t *timeline) forget(zone string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if z := t.zones[zone]; z != nil {
		t.failing.Add(-int64(len(z.failing)))
	}
	delete(t.zones, zone)
}

// report returns the events of zone, or of every zone when zone is empty.
func (t *timeline) report(zone string) TimelineReport {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := TimelineReport{Now: time.Now(), Cap: timelineCap, Zones: map[string][]TimelineEvent{}}
	for name, z := range t.zones {
		if zone == "" || name == zone {
			r.Zones[name] = z.events()
		}
	}
	return r
}

func (g *Global) serveTimeline(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, g.timeline.report(r.URL.Query().Get("zone")))
}

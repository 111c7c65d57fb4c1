package retry

import (
	"sync"
	"time"

	"github.com/kds-host/kds-host/engine/event"
)

// Emulation modes reproduce the retry behaviour of Kuma 2.3 to 2.7, for side-by-side figures.
// They block the stream's goroutine on purpose; never use them outside a reproduction.
const (
	// EmulatePerType sleeps the NACK backoff inside the xDS callback for every NACKed type.
	EmulatePerType = "blocking-per-type"
	// EmulatePerStream sleeps once for the NACKs of all types that queued up during a sleep
	// (the upstream fix): still a stall of the whole stream, but one per burst, not per type.
	EmulatePerStream = "blocking-per-stream"
)

// burst is how soon after a sleep a NACK counts as one that queued up during it: the stream's
// goroutine handles those back to back once the sleep ends.
const burst = 100 * time.Millisecond

// Blocking is the observer of the old behaviour: on a NACK it sleeps the backoff inside
// the callback, stalling every type on the stream, and then resends the rejected names.
type Blocking struct {
	PerStream bool
	Backoff   time.Duration
	Resender  Resender

	mu     sync.Mutex            // guards bursts
	bursts map[int64]*burstState // per stream
}

// burstState is a stream's last sleep: when it ended, and the types handled since without one.
type burstState struct {
	ended    time.Time
	typeURLs map[string]bool
}

// Observer is how the emulation hears of NACKs, and of streams closing.
func (b *Blocking) Observer() event.Observer {
	return event.Observer{NACK: b.Nacked, StreamClosed: b.streamClosed}
}

func (b *Blocking) streamClosed(id int64, _ string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.bursts, id)
}

// Nacked blocks the stream as the old code did: it sleeps inside the xDS callback.
func (b *Blocking) Nacked(n event.NACK) {
	sleep := true
	if b.PerStream {
		// One sleep covers the NACKs of the other types that queued up while it lasted: they
		// come right after it, once each. A type NACKed again starts a new sleep.
		b.mu.Lock()
		if b.bursts == nil {
			b.bursts = map[int64]*burstState{}
		}
		bs := b.bursts[n.StreamID]
		if bs != nil && time.Since(bs.ended) <= burst && !bs.typeURLs[n.TypeURL] {
			bs.typeURLs[n.TypeURL] = true
			sleep = false
		}
		b.mu.Unlock()
	}
	if sleep {
		time.Sleep(b.Backoff)
		if b.PerStream {
			b.mu.Lock()
			b.bursts[n.StreamID] = &burstState{ended: time.Now(), typeURLs: map[string]bool{n.TypeURL: true}}
			b.mu.Unlock()
		}
	}
	names := make([]string, 0, len(n.Rejected))
	for _, r := range n.Rejected {
		names = append(names, r.Name)
	}
	b.Resender.Resend(n.StreamID, map[string][]string{n.TypeURL: names})
}

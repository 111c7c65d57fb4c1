package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"
)

// latencyWindow is how many recent calls the latency percentiles are computed over.
const latencyWindow = 1024

// Duration is a time.Duration that JSON writes as a string, "1.5ms".
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a string such as "1.5ms".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"1.5ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Latency holds percentiles of the latency of a plugin's recent calls (the last 1024).
type Latency struct {
	P50 Duration `json:"p50"`
	P90 Duration `json:"p90"`
	P99 Duration `json:"p99"`
}

// callStats counts one plugin's calls and keeps the latencies of the latest ones.
type callStats struct {
	mu                      sync.Mutex // guards the fields below
	calls, errors, timeouts uint64
	recent                  [latencyWindow]time.Duration
	next                    int // where the next latency goes in recent
	filled                  int // how many of recent hold a latency
}

// record counts one call: its latency, and whether it failed or timed out (a timeout is also an
// error).
func (s *callStats) record(d time.Duration, failed, timedOut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if failed {
		s.errors++
	}
	if timedOut {
		s.timeouts++
	}
	s.recent[s.next] = d
	s.next = (s.next + 1) % latencyWindow
	s.filled = min(s.filled+1, latencyWindow)
}

// fill copies the counters and the latency percentiles into st.
func (s *callStats) fill(st *Status) {
	s.mu.Lock()
	st.Calls, st.Errors, st.Timeouts = s.calls, s.errors, s.timeouts
	lat := slices.Clone(s.recent[:s.filled])
	s.mu.Unlock()
	slices.Sort(lat)
	st.Latency = Latency{P50: percentile(lat, 50), P90: percentile(lat, 90), P99: percentile(lat, 99)}
}

// percentile returns the p-th percentile (nearest rank) of sorted values, 0 for none.
func percentile(sorted []time.Duration, p int) Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return Duration(sorted[max(rank, 1)-1])
}

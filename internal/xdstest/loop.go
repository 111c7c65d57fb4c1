package xdstest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

const s5 = 5 * time.Second

// Loop defaults: one RPC every Interval, each with Deadline.
const (
	Interval = 10 * time.Millisecond
	Deadline = 500 * time.Millisecond
)

// Counts are what an RPC loop saw: RPCs made, succeeded, failed; failures per "Code: message"
// (as status.Code and status.Message of the error); successes per backend (ServerId).
type Counts struct {
	RPCs      int            `json:"rpcs"`
	OK        int            `json:"ok"`
	Failed    int            `json:"failed"`
	Failures  map[string]int `json:"failures,omitempty"`
	ByBackend map[string]int `json:"by_backend,omitempty"`
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.RPCs += o.RPCs
	c.OK += o.OK
	c.Failed += o.Failed
	for k, v := range o.Failures {
		if c.Failures == nil {
			c.Failures = map[string]int{}
		}
		c.Failures[k] += v
	}
	for k, v := range o.ByBackend {
		if c.ByBackend == nil {
			c.ByBackend = map[string]int{}
		}
		c.ByBackend[k] += v
	}
}

// FailuresMatching counts the failures whose "Code: message" contains sub.
func (c Counts) FailuresMatching(sub string) int {
	n := 0
	for k, v := range c.Failures {
		if strings.Contains(k, sub) {
			n += v
		}
	}
	return n
}

// String is a one-line summary; failures sorted by count.
func (c Counts) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rpcs=%d ok=%d failed=%d", c.RPCs, c.OK, c.Failed)
	if len(c.ByBackend) > 0 {
		keys := make([]string, 0, len(c.ByBackend))
		for k := range c.ByBackend {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(" backends=")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%s:%d", k, c.ByBackend[k])
		}
	}
	type kv struct {
		k string
		v int
	}
	var fs []kv
	for k, v := range c.Failures {
		fs = append(fs, kv{k, v})
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].v > fs[j].v || fs[i].v == fs[j].v && fs[i].k < fs[j].k })
	for _, f := range fs {
		fmt.Fprintf(&b, "\n    %d x %s", f.v, f.k)
	}
	return b.String()
}

// Loop makes one UnaryCall every interval on a connection, each with its own deadline, in order
// (an RPC that takes longer delays the next), counting as it goes.
type Loop struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	counts Counts
}

// StartLoop starts a loop on cc; interval and deadline 0 mean Interval and Deadline.
func StartLoop(cc grpc.ClientConnInterface, interval, deadline time.Duration) *Loop {
	if interval <= 0 {
		interval = Interval
	}
	if deadline <= 0 {
		deadline = Deadline
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{cancel: cancel, done: make(chan struct{}), counts: Counts{Failures: map[string]int{}, ByBackend: map[string]int{}}}
	client := testgrpc.NewTestServiceClient(cc)
	go func() {
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, deadline)
			resp, err := client.UnaryCall(rctx, &testgrpc.SimpleRequest{FillServerId: true})
			rcancel()
			if ctx.Err() != nil {
				return // stopped mid-RPC: not counted
			}
			l.mu.Lock()
			l.counts.RPCs++
			if err != nil {
				l.counts.Failed++
				st := status.Convert(err)
				l.counts.Failures[st.Code().String()+": "+st.Message()]++
			} else {
				l.counts.OK++
				l.counts.ByBackend[resp.GetServerId()]++
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// Snapshot returns the counts so far, the loop going on.
func (l *Loop) Snapshot() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	var c Counts
	c.Add(l.counts)
	return c
}

// Stop stops the loop, waits for it, and returns its counts since the last Take.
func (l *Loop) Stop() Counts {
	l.cancel()
	<-l.done
	return l.Take()
}

// Take returns the counts since the last Take (or the start) and starts counting afresh, the loop
// going on.
func (l *Loop) Take() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts
	l.counts = Counts{Failures: map[string]int{}, ByBackend: map[string]int{}}
	return c
}

// Failure kinds, as Classify names them.
const (
	KindMidSwitch   = "mid-switch"  // grpc-go picked a cluster it had just dropped ("unknown cluster selected for RPC")
	KindRefused     = "refused"     // the route's cluster was refused by the client (its NACK detail)
	KindNoTargets   = "no-targets"  // no endpoint yet ("no targets to pick from", "no children")
	KindDeadline    = "deadline"    // DeadlineExceeded
	KindUnavailable = "unavailable" // any other Unavailable
	KindOther       = "other"
)

// Classify names the kind of a failure key of Counts.Failures ("Code: message").
func Classify(failure string) string {
	switch {
	case strings.Contains(failure, "unknown cluster selected"):
		return KindMidSwitch
	case strings.Contains(failure, "failed to push new configuration"), strings.Contains(failure, "unexpected lbPolicy"):
		return KindRefused
	case strings.Contains(failure, "no targets to pick from"), strings.Contains(failure, "no children"):
		return KindNoTargets
	case strings.HasPrefix(failure, "DeadlineExceeded"):
		return KindDeadline
	case strings.HasPrefix(failure, "Unavailable"):
		return KindUnavailable
	}
	return KindOther
}

// Kinds counts the failures of c per Classify kind.
func (c Counts) Kinds() map[string]int {
	out := map[string]int{}
	for k, v := range c.Failures {
		out[Classify(k)] += v
	}
	return out
}

package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/host/store"
)

// DefaultProbeInterval is how often a control plane probes its store when its config does not
// say.
const DefaultProbeInterval = 2 * time.Second

// storeProbe checks the store on its own schedule, so that a scrape and /readyz read the last
// answer and never wait on the store:
//   - an interval after the last probe returned, one probe makes the check storeReady makes,
//     within timeout;
//   - a probe still running past its timeout counts as a store that does not answer, whatever
//     its goroutine does meanwhile;
//   - at most one probe runs at a time;
//   - with a registry (a global), every knownZonesEvery probes that found the store ready also
//     read the zones the store knows, for knownZones and onKnown.
type storeProbe struct {
	st       store.Store
	interval time.Duration
	timeout  time.Duration
	registry store.ZoneRegistry          // nil: known zones are not read
	onKnown  func(known map[string]bool) // told each list of known zones read, on run's goroutine
	log      hclog.Logger

	mu      sync.Mutex // guards the fields below; held only to read or set them
	began   time.Time  // when the probe under way began; zero: none under way
	at      time.Time  // when the last probe answered
	err     error      // the last probe's answer
	checked bool       // a probe has answered
	known   map[string]bool
}

// knownZonesEvery is how often, in probes, a global reads the zones its store knows: a zone is
// recorded within a heartbeat of connecting and stays in the zone table for --zone-grace after
// it leaves, so the list only needs to be a few probes fresh.
const knownZonesEvery = 5

func newStoreProbe(st store.Store, interval time.Duration) *storeProbe {
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	return &storeProbe{st: st, interval: interval, timeout: readyTimeout}
}

// run probes at once and then an interval after each probe returns, until ctx ends; it
// returns when its probe under way has returned.
func (p *storeProbe) run(ctx context.Context) {
	if p.st == nil {
		return
	}
	next := time.NewTimer(0)
	defer next.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
		}
		if p.probe(ctx) == nil && p.registry != nil && n%knownZonesEvery == 0 {
			p.readKnown(ctx)
		}
		next.Reset(p.interval)
	}
}

// readKnown reads the zones the store knows.
func (p *storeProbe) readKnown(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	known, err := p.registry.KnownZones(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && p.log != nil {
			p.log.Warn("read the zones the store knows (kds_zone_connected keeps the last list)", "error", err)
		}
		return
	}
	set := make(map[string]bool, len(known))
	for _, z := range known {
		set[z.Zone] = true
	}
	p.mu.Lock()
	p.known = set
	p.mu.Unlock()
	if p.onKnown != nil {
		p.onKnown(set)
	}
}

// knownZones is the zones the store knew at the last read (nil before the first, or without a
// registry). The caller must not change it.
func (p *storeProbe) knownZones() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.known
}

// forget drops zone from the known zones until the next read (it was just forgotten).
func (p *storeProbe) forget(zone string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.known[zone] {
		return
	}
	known := make(map[string]bool, len(p.known))
	for z := range p.known {
		if z != zone {
			known[z] = true
		}
	}
	p.known = known
}

// probe checks the store once and returns its answer.
func (p *storeProbe) probe(ctx context.Context) error {
	p.mu.Lock()
	p.began = time.Now()
	p.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	err := storeReady(cctx, p.st)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: not the store's answer
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.began, p.at, p.err, p.checked = time.Time{}, time.Now(), err, true
	return err
}

// errProbeLate is the answer of a probe that has run longer than its timeout.
var errProbeLate = errors.New("the store does not answer: its probe is still waiting")

// probeAnswer is what the store probe last found.
type probeAnswer struct {
	answered bool          // a probe has answered, or one has run past its timeout
	err      error         // nil: the store is ready
	age      time.Duration // since the answer (for a late probe, since it began)
}

// last is the probe's last answer; a probe under way for longer than the timeout is one: the
// store does not answer.
func (p *storeProbe) last() probeAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if !p.began.IsZero() && now.Sub(p.began) > p.timeout {
		waited := now.Sub(p.began)
		return probeAnswer{answered: true, err: fmt.Errorf("%w (for %s)", errProbeLate, waited.Round(time.Millisecond)), age: waited}
	}
	if !p.checked {
		return probeAnswer{}
	}
	return probeAnswer{answered: true, err: p.err, age: now.Sub(p.at)}
}

// ready is what /readyz says of the store: nil and how old the probe's answer is, or why the
// store is not ready.
func (p *storeProbe) ready() (string, error) {
	a := p.last()
	switch {
	case !a.answered:
		return "", errors.New("the store has not answered its first probe yet")
	case a.err != nil:
		return "", fmt.Errorf("%w (store probed %s ago)", a.err, a.age.Round(time.Millisecond))
	}
	return fmt.Sprintf("store probed %s ago", a.age.Round(time.Millisecond)), nil
}

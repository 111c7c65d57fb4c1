// Package policy runs the policies a control plane asks about its clients: the retry policy
// (when to send again what a client refused) and the owner check (whether a resource may go to a
// client before what it references). A Runtime runs them as go-plugin binaries that serve the
// RetryForcer and OwnerCheck services of package shared: it verifies, supervises, measures and
// swaps them at runtime, and the built-in reference policies answer for what no binary serves.
// Open starts one from Plugin values; Within bounds a call to an in-process policy by a deadline.
//
// A plugin sees an allow-listed environment (Options.Env, Spec.Env), a pinned one runs from a
// private copy of the bytes that were hashed (see launch.Options), it dies with its host
// (Pdeathsig), a kill is bounded (Options.KillTimeout), and its log lines reach Options.Logger at
// a bounded rate (Options.LogRate), the excess counted and summarised.
package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/plugins/owner-check/ownerpredict"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
)

// Status is what the runtime knows about one plugin.
type Status struct {
	// Name is the name the plugin gives in Describe, or "builtin".
	Name string `json:"name"`
	Path string `json:"path"`
	// Checksum is "sha256:HEX" of the binary: the pinned one, or the one computed at start.
	Checksum string `json:"checksum,omitempty"`
	Version  string `json:"version,omitempty"`
	// Env names the host environment variables the plugin sees besides PATH, HOME and TMPDIR
	// (Options.Env and its Spec's); never their values.
	Env []string `json:"env,omitempty"`
	// Serves lists the services the plugin answers (RetryForcer, OwnerCheck). For builtin, the
	// services no plugin serves; FallbackFor is RetryForcer when a plugin serves it (the
	// scheduler's fallback, Runtime.Fallback).
	Serves      []string `json:"serves"`
	FallbackFor []string `json:"fallbackFor,omitempty"`
	// Policy is the retry policy in force, as Configure described it.
	Policy string `json:"policy,omitempty"`
	// PID is the plugin process's, while it runs.
	PID   int    `json:"pid,omitempty"`
	State string `json:"state"`
	// Since is when State began.
	Since time.Time `json:"since"`
	// Restarts counts processes started after one exited or hung.
	Restarts int `json:"restarts"`
	// Calls, Errors and Timeouts count calls since the plugin was loaded (a reload starts them
	// over); Errors include timeouts and calls refused while the plugin was down.
	Calls    uint64  `json:"calls"`
	Errors   uint64  `json:"errors"`
	Timeouts uint64  `json:"timeouts"`
	Latency  Latency `json:"latency"`
	// LastError is the latest failure: a call that failed (an answer outside the host's bounds
	// included), or why the plugin went out of service or could not be started again.
	LastError   string     `json:"lastError,omitempty"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
}

// ReloadResult is the outcome of the latest reload.
type ReloadResult struct {
	At    time.Time `json:"at"`
	Error string    `json:"error,omitempty"`
}

// Runtime runs the plugins. Its RetryForcer and OwnerCheck never wait for a plugin that is
// down: they fail at once, and the caller falls back (the scheduler to Fallback, the owner
// holds open).
type Runtime struct {
	cfg          Config
	log          *slog.Logger
	metrics      *metrics
	builtinStats callStats
	started      time.Time
	gen          atomic.Pointer[generation]
	generations  atomic.Uint64 // generations installed

	rf *retryForwarder
	fb *retryForwarder
	oc *ownerForwarder

	mu         sync.Mutex // serializes Reload and Close
	closed     bool
	lastReload atomic.Pointer[ReloadResult]
}

// generation is one loaded set of plugins. A reload builds a new one and swaps it in whole.
type generation struct {
	retry, owner *supervisor // nil: the built-in plugin answers
	supervisors  []*supervisor
	relays       []*logRelay // the log relays of the supervisors' plugins, closed after them
	builtin      *builtin
}

// stop stops the generation's plugins and returns when they are gone.
func (g *generation) stop() {
	stopAll(g.supervisors)
	for _, r := range g.relays {
		r.close()
	}
}

// builtin is the in-process reference plugins.
type builtin struct {
	rf *retrypolicy.Forcer
	oc *ownerpredict.Predictor
}

// New starts the plugins of cfg.Plugins and supervises them. It fails, with everything it
// started stopped, when a plugin cannot be used: a wrong checksum (*launch.ChecksumError), a
// binary that does not speak the plugin protocol (launch.ErrNotAPlugin), a bad policy document,
// two plugins serving the same service; or on bad Metrics or Env. A negative duration, rate or
// count is its default (Open refuses them).
func New(cfg Config) (*Runtime, error) { return start(context.Background(), cfg) }

func start(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg.setDefaults()
	cfg.Bounds = cfg.Bounds.WithDefaults()
	if err := launch.CheckEnv(cfg.Env); err != nil {
		return nil, fmt.Errorf("the plugins' environment: %w", err)
	}
	if err := cfg.Metrics.validate(); err != nil {
		return nil, err
	}
	rt := &Runtime{cfg: cfg, log: cfg.Logger.With(LoggerKey, runtimeName), started: time.Now()}
	rt.metrics = newMetrics(cfg.Metrics, rt.Status)
	rt.rf = &retryForwarder{forwarder[shared.RetryForcer]{rt, retrySide}}
	rt.fb = &retryForwarder{forwarder[shared.RetryForcer]{rt, fallbackSide}}
	rt.oc = &ownerForwarder{forwarder[shared.OwnerCheck]{rt, ownerSide}}
	g, err := rt.load(ctx, cfg.Plugins)
	if err != nil {
		return nil, err
	}
	rt.install(g)
	rt.log.Info("plugins loaded", "plugins", describeGeneration(g))
	return rt, nil
}

// Reload reads the plugins to run with read (kds-host: its --config file), starts them, checks and
// configures them, swaps them in, and then stops the ones they replace (after the calls in
// flight). On any error, read's included, nothing changes: the running plugins stay, and the
// error says why (it is also logged, counted and kept for LastReload).
func (rt *Runtime) Reload(ctx context.Context, read func() (Plugins, error)) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return errors.New("the plugin runtime is closed")
	}
	var g *generation
	p, err := read()
	if err == nil {
		g, err = rt.load(ctx, p)
	}
	if err != nil {
		rt.lastReload.Store(&ReloadResult{At: time.Now(), Error: err.Error()})
		rt.metrics.reloads.WithLabelValues("error").Inc()
		rt.log.Error("plugin reload failed; the running plugins stay", "error", err)
		return err
	}
	old := rt.install(g)
	// The reload has taken effect once the new plugins are in force: say so before the old
	// ones are stopped (which waits for their calls in flight), so Status and LastReload agree.
	rt.lastReload.Store(&ReloadResult{At: time.Now()})
	old.stop()
	rt.metrics.reloads.WithLabelValues("ok").Inc()
	rt.log.Info("plugins reloaded", "plugins", describeGeneration(g))
	return nil
}

// LastReload is the outcome of the latest Reload, nil before the first. It does not wait for a
// reload under way.
func (rt *Runtime) LastReload() *ReloadResult {
	r := rt.lastReload.Load()
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// Close stops every plugin process and returns when they are gone. The built-in plugins keep
// answering.
func (rt *Runtime) Close() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return
	}
	rt.closed = true
	old := rt.install(&generation{builtin: rt.gen.Load().builtin})
	old.stop()
}

// Collectors are the runtime's Prometheus metrics, for the host's registry.
func (rt *Runtime) Collectors() []prometheus.Collector { return rt.metrics.collectors() }

// RetryForcer is the retry policy in force: the RetryForcer plugin's, or the built-in one when no
// plugin serves it. Ask it at every decision (engine/retry's scheduler does), so that a reload
// counts from the next decision. While the plugin is down its calls fail at once with
// Unavailable, and the caller's fallback (Fallback) answers.
func (rt *Runtime) RetryForcer() shared.RetryForcer { return rt.rf }

// Fallback is the built-in retry policy (configured by a "builtin" entry's document), counted
// under "builtin" in Status and metrics: the scheduler's fallback.
func (rt *Runtime) Fallback() shared.RetryForcer { return rt.fb }

// OwnerCheck is the owner check in force: the OwnerCheck plugin, or the built-in one when no
// plugin serves it. While the plugin is down its calls fail at once with Unavailable, and the
// caller fails open (it sends everything, and retries cover the rest); the built-in check does
// not stand in for a plugin the user chose.
func (rt *Runtime) OwnerCheck() shared.OwnerCheck { return rt.oc }

// Generation changes whenever another set of plugins comes into force (a load, a reload, Close):
// answers given before may not hold after. A plugin restarted after a crash is the same one.
func (rt *Runtime) Generation() uint64 { return rt.generations.Load() }

// Status describes every plugin, the built-in plugins last.
func (rt *Runtime) Status() []Status {
	g := rt.gen.Load()
	out := make([]Status, 0, len(g.supervisors)+1)
	for _, s := range g.supervisors {
		out = append(out, s.status())
	}
	b := Status{
		Name: Builtin, Path: Builtin, Version: retrypolicy.Version, State: StateBuiltin, Since: rt.started,
		Policy: g.builtin.rf.Policy().String(), Serves: []string{},
	}
	if g.retry == nil {
		b.Serves = append(b.Serves, RetryForcerService)
	} else {
		b.FallbackFor = append(b.FallbackFor, RetryForcerService)
	}
	if g.owner == nil {
		b.Serves = append(b.Serves, OwnerCheckService)
	}
	rt.builtinStats.fill(&b)
	return append(out, b)
}

// install makes g current, starts supervising its plugins, and returns the generation it
// replaced.
func (rt *Runtime) install(g *generation) *generation {
	for _, s := range g.supervisors {
		s.begin()
	}
	old := rt.gen.Swap(g)
	rt.generations.Add(1)
	if old == nil {
		old = &generation{}
	}
	return old
}

func stopAll(sups []*supervisor) {
	var wg sync.WaitGroup
	for _, s := range sups {
		wg.Go(s.stop)
	}
	wg.Wait()
}

// load starts the binaries of p (in parallel), learns what each serves, configures them, and
// returns them as a generation not yet supervised. On error it stops what it started.
func (rt *Runtime) load(ctx context.Context, p Plugins) (*generation, error) {
	var bins []Spec
	var builtinDoc *Document
	seenBuiltin := false
	for _, s := range p.List {
		if s.Path == Builtin {
			if seenBuiltin {
				return nil, errors.New("builtin is listed twice")
			}
			seenBuiltin, builtinDoc = true, s.Document
			continue
		}
		if slices.ContainsFunc(bins, func(b Spec) bool { return b.Path == s.Path }) {
			return nil, fmt.Errorf("plugin %s is listed twice", s.Path)
		}
		bins = append(bins, s)
	}

	insts := make([]*instance, len(bins))
	errs := make([]error, len(bins))
	relays := make([]*logRelay, len(bins))
	var wg sync.WaitGroup
	for i, s := range bins {
		relays[i] = newLogRelay(filepath.Base(s.Path), &rt.cfg.Options, rt.metrics)
		wg.Go(func() { insts[i], errs[i] = startInstance(ctx, s, &rt.cfg.Options, relays[i].logger()) })
	}
	wg.Wait()
	fail := func(err error) (*generation, error) {
		var kill sync.WaitGroup
		for _, inst := range insts {
			if inst != nil {
				kill.Go(inst.kill)
			}
		}
		kill.Wait()
		for _, r := range relays {
			r.close()
		}
		return nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}

	g := &generation{relays: relays}
	var rfFrom, ocFrom string
	for i, inst := range insts {
		if inst.rf != nil {
			if rfFrom != "" {
				return fail(fmt.Errorf("plugins %s and %s both serve RetryForcer: run one of them", rfFrom, bins[i].Path))
			}
			rfFrom = bins[i].Path
		}
		if inst.oc != nil {
			if ocFrom != "" {
				return fail(fmt.Errorf("plugins %s and %s both serve OwnerCheck: run one of them", ocFrom, bins[i].Path))
			}
			ocFrom = bins[i].Path
		}
	}

	// Policy documents: a Spec's own, else the one named after the plugin.
	used := map[string]bool{}
	byName := func(names ...string) *Document {
		for _, n := range names {
			if d, ok := p.Documents[n]; ok {
				used[n] = true
				return &d
			}
		}
		return nil
	}
	docs := make([]*Document, len(bins))
	for i, inst := range insts {
		docs[i] = bins[i].Document
		if docs[i] == nil {
			docs[i] = byName(inst.name, filepath.Base(bins[i].Path))
		}
		if docs[i] != nil && len(bytes.TrimSpace(docs[i].Data)) == 0 {
			// An empty document (an empty file, say) is no document: the plugin keeps
			// its defaults, and Configure is not called (docs/plugin-protocol.md).
			rt.log.Info("the policy document is empty: the plugin keeps its defaults", "plugin", inst.name, "document", docs[i].Source)
			docs[i] = nil
		}
		if docs[i] == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, rt.cfg.StartTimeout)
		err := inst.configure(cctx, docs[i])
		cancel()
		if err != nil {
			return fail(err)
		}
	}
	if builtinDoc == nil {
		builtinDoc = byName(Builtin)
	}
	b, err := newBuiltin(builtinDoc)
	if err != nil {
		return fail(err)
	}
	for n := range p.Documents {
		if !used[n] {
			return fail(fmt.Errorf("a policy document is given for plugin %q, but no plugin has that name (plugins: %s)",
				n, pluginNames(insts, bins)))
		}
	}

	for i, inst := range insts {
		spec, doc, log := bins[i], docs[i], relays[i].logger()
		wantRF, wantOC := inst.rf != nil, inst.oc != nil
		start := func(ctx context.Context) (*instance, error) {
			return rt.restartInstance(ctx, spec, doc, wantRF, wantOC, log)
		}
		s := newSupervisor(spec, inst, start, &rt.cfg.Options, rt.log, rt.metrics)
		g.supervisors = append(g.supervisors, s)
		if wantRF {
			g.retry = s
		}
		if wantOC {
			g.owner = s
		}
	}
	g.builtin = b
	return g, nil
}

// restartInstance starts a plugin again: it must still serve what it served, gets the same
// policy document, and logs through the same relay.
func (rt *Runtime) restartInstance(ctx context.Context, spec Spec, doc *Document, wantRF, wantOC bool, log hclog.Logger) (*instance, error) {
	inst, err := startInstance(ctx, spec, &rt.cfg.Options, log)
	if err != nil {
		return nil, err
	}
	switch {
	case wantRF && inst.rf == nil:
		err = fmt.Errorf("plugin %s no longer serves RetryForcer", spec.Path)
	case wantOC && inst.oc == nil:
		err = fmt.Errorf("plugin %s no longer serves OwnerCheck", spec.Path)
	case doc != nil:
		cctx, cancel := context.WithTimeout(ctx, rt.cfg.StartTimeout)
		err = inst.configure(cctx, doc)
		cancel()
	}
	if err != nil {
		inst.kill()
		return nil, err
	}
	return inst, nil
}

func newBuiltin(doc *Document) (*builtin, error) {
	b := &builtin{rf: retrypolicy.New(), oc: ownerpredict.New()}
	if doc == nil {
		return b, nil
	}
	cfg, err := retrypolicy.Parse(doc.Data)
	if err == nil {
		err = b.rf.Apply(cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("configure the built-in retry policy with %s: %w", doc.Source, err)
	}
	return b, nil
}

func pluginNames(insts []*instance, bins []Spec) string {
	names := []string{Builtin}
	for i, inst := range insts {
		names = append(names, fmt.Sprintf("%s (%s)", inst.name, filepath.Base(bins[i].Path)))
	}
	return strings.Join(names, ", ")
}

// describeGeneration is a one-line summary for the log.
func describeGeneration(g *generation) string {
	var parts []string
	for _, s := range g.supervisors {
		st := s.status()
		parts = append(parts, fmt.Sprintf("%s %s pid %d serves %s", st.Name, st.Path, st.PID, strings.Join(st.Serves, "+")))
	}
	if g.retry == nil || g.owner == nil {
		parts = append(parts, "builtin")
	}
	return strings.Join(parts, "; ")
}

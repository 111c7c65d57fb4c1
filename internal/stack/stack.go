// Package stack assembles the engine's parts into one served cache: the cache, the callbacks
// that follow each stream (engine.Tracker), the node table and its expiry, the retry scheduler
// and the owner holds. guard.NewCache serves adopters from it; kds-host's global serves its
// zones from it, reading each part. It is internal: an adopter takes the guard's narrow API.
package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/engine/owner"
	"github.com/kds-host/kds-host/engine/retry"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
	pluginv1 "github.com/kds-host/kds-host/proto/plugin/v1"
	"github.com/kds-host/kds-host/shared"
)

// Config is what New assembles. The zero value of a field is its default.
type Config struct {
	// Types are the type URLs served, in the order a node gets them when they are ready
	// together (what others reference first). Required, each once.
	Types []string
	// Logger logs what the retry policy parks and gives up on (nil: nothing).
	Logger *slog.Logger

	// RetryPolicy returns the policy in force (nil: Fallback); Fallback decides when it fails
	// (nil: the built-in policy). PolicyTimeout, Bounds and OnFallback are retry.StandardConfig's.
	RetryPolicy   func() shared.RetryForcer
	Fallback      shared.RetryForcer
	PolicyTimeout time.Duration
	Bounds        shared.Bounds
	OnFallback    func(req *pluginv1.ScheduleRequest, err error)
	// RetryHooks hear of the retry rounds, after the logging ones.
	RetryHooks retry.Hooks

	// OwnerCheck, if set, turns the owner holds on (owner.Config's Policy); the other Owner
	// fields are owner.Config's.
	OwnerCheck        func() shared.OwnerCheck
	OwnerCheckTimeout time.Duration
	OwnerHooks        owner.Hooks
	OwnerGeneration   func() uint64
	OwnerMapping      owner.Mapping

	// Limits bound what each node may cost (zero fields: engine.DefaultLimits).
	Limits engine.Limits
	// Observers hear of every stream event, after the node table and before the retry
	// scheduler.
	Observers []event.Observer
	// PlainNACKsMayPass: a NACK without kds-host's structured detail may refuse for a passing
	// reason, so its names are resent on the policy's backoff. Off, such a NACK is about content,
	// as Envoy's and grpc-go's are: its names count as INVALID.
	PlainNACKsMayPass bool
	// Grace is how long a node's state outlives its last stream (default 1m); Forget, if set,
	// hears of each node whose grace ended.
	Grace  time.Duration
	Forget func(node string)
	// Emulate reproduces an old, blocking retry behaviour (retry.EmulatePerType or
	// retry.EmulatePerStream), sleeping NACKBackoff (default 5s) inside the xDS callback.
	Emulate     string
	NACKBackoff time.Duration
}

// Stack is the assembled cache. Its parts are set by New and never change.
type Stack struct {
	Cache   *engine.Cache
	Tracker *engine.Tracker
	Nodes   *engine.Nodes
	Retry   *retry.Scheduler // nil when emulating an old behaviour
	Holds   *owner.Holds     // nil without Config.OwnerCheck

	grace  time.Duration
	forget func(node string)
	stop   chan struct{} // closed by Close: the expiry stops
	done   chan struct{}
	closed sync.Once
}

// New assembles a Stack; Close stops it. Its errors name the field at fault.
func New(cfg Config) (_ *Stack, err error) {
	if len(cfg.Types) == 0 {
		return nil, errors.New("stack: Config.Types: the type URLs served are required")
	}
	for i, t := range cfg.Types {
		if t == "" || slices.Contains(cfg.Types[:i], t) {
			return nil, fmt.Errorf("stack: Config.Types[%d] %q: empty or given twice", i, t)
		}
	}
	if cfg.Grace <= 0 {
		cfg.Grace = time.Minute
	}
	kc := engine.NewCache(cfg.Types)
	s := &Stack{Cache: kc, Nodes: engine.NewNodes(kc), grace: cfg.Grace, forget: cfg.Forget, stop: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	observers := append([]event.Observer{s.Nodes.Observer()}, cfg.Observers...)
	switch cfg.Emulate {
	case "":
		s.Retry, err = NewScheduler(cfg.RetryPolicy, cfg.Fallback, retry.StandardConfig{Timeout: cfg.PolicyTimeout, Bounds: cfg.Bounds, OnFallback: cfg.OnFallback},
			LoggingHooks(cfg.Logger, cfg.RetryHooks), func(id int64) retry.Session {
				if s := kc.Session(id); s != nil {
					return s
				}
				return nil // not a typed nil
			})
		if err != nil {
			return nil, err
		}
		observers = append(observers, s.Retry.Observer())
	case retry.EmulatePerType, retry.EmulatePerStream:
		if cfg.NACKBackoff <= 0 {
			cfg.NACKBackoff = 5 * time.Second
		}
		b := &retry.Blocking{PerStream: cfg.Emulate == retry.EmulatePerStream, Backoff: cfg.NACKBackoff, Resender: kc}
		observers = append(observers, b.Observer())
	default:
		return nil, fmt.Errorf("emulate %q: want %s or %s", cfg.Emulate, retry.EmulatePerType, retry.EmulatePerStream)
	}
	if cfg.OwnerCheck != nil {
		s.Holds, err = owner.New(owner.Config{Mapping: cfg.OwnerMapping, Policy: cfg.OwnerCheck, Timeout: cfg.OwnerCheckTimeout,
			Source: kc, Inventory: s.Nodes, Refresher: kc, Hooks: cfg.OwnerHooks, Generation: cfg.OwnerGeneration})
		if err != nil {
			return nil, err
		}
		kc.UseViews(true) // a node sees what its owner checks published, nothing before
		observers = append(observers, s.Holds.Observer())
	}
	s.Tracker = engine.NewTracker(kc, observers...)
	if cfg.Emulate != "" {
		s.Tracker.SetCallbacksStallStreams()
	}
	go s.expire()
	s.Tracker.SetLimits(cfg.Limits)
	if !cfg.PlainNACKsMayPass {
		s.Tracker.SetPlainCause(event.CauseInvalid)
	}
	return s, nil
}

// NewScheduler is a retry scheduler over sessions: the policy in force (current, else
// fallback) checked, bounded and backed by fallback (nil: the built-in policy).
func NewScheduler(current func() shared.RetryForcer, fallback shared.RetryForcer, cfg retry.StandardConfig, hooks retry.Hooks, sessions func(int64) retry.Session) (*retry.Scheduler, error) {
	if fallback == nil {
		fallback = retrypolicy.New()
	}
	if current == nil {
		current = func() shared.RetryForcer { return fallback }
	}
	return retry.NewScheduler(retry.Config{Policy: retry.Standard(current, fallback, cfg), Sessions: sessions, Hooks: hooks})
}

// LoggingHooks log what the retry policy parks and gives up on (log nil: nothing), then call
// next's hooks.
func LoggingHooks(log *slog.Logger, next retry.Hooks) retry.Hooks {
	if log == nil {
		return next
	}
	h := next
	h.Parked = func(node string, parked []retry.ParkedName) {
		for _, p := range parked {
			log.Info("resource parked until its content changes", "node", node, "type", p.TypeURL, "name", p.Name, "reason", p.Reason)
		}
		if next.Parked != nil {
			next.Parked(node, parked)
		}
	}
	h.GaveUp = func(node, reason string) {
		log.Warn("retry policy gave up", "node", node, "reason", reason)
		if next.GaveUp != nil {
			next.GaveUp(node, reason)
		}
	}
	return h
}

// Close stops the expiry, the owner checks, the retry decisions in flight and every stream's
// sender. A second Close does nothing.
func (s *Stack) Close() {
	s.closed.Do(func() {
		close(s.stop)
		if s.Tracker != nil { // the expiry runs
			<-s.done
		}
		if s.Holds != nil {
			s.Holds.Close()
		}
		if s.Retry != nil {
			s.Retry.Close()
		}
		s.Cache.Close()
	})
}

// SetSnapshot replaces what is served, and has the owner holds check what changed.
func (s *Stack) SetSnapshot(snap *engine.Snapshot) {
	if s.Holds != nil {
		// A write of a few resources is decided first for the nodes that ask the same, so that
		// the cache's one evaluation of each of their streams sends it.
		s.Holds.Prepare(snap)
	}
	s.Cache.SetSnapshot(snap)
	if s.Holds != nil {
		s.Holds.Changed(snap)
	}
}

// SetNodesSnapshot replaces what each of nodes is served (engine.Cache.SetNodesSnapshot), and
// has the owner holds check them again.
func (s *Stack) SetNodesSnapshot(nodes []string, snap *engine.Snapshot) {
	s.Cache.SetNodesSnapshot(nodes, snap)
	if s.Holds != nil {
		for _, n := range nodes {
			s.Holds.NodeChanged(n)
		}
	}
}

// SetNodeSnapshot replaces what one node is served (engine.Cache.SetNodeSnapshot), and has the
// owner holds check the node again.
func (s *Stack) SetNodeSnapshot(node string, snap *engine.Snapshot) {
	s.Cache.SetNodeSnapshot(node, snap)
	if s.Holds != nil {
		s.Holds.NodeChanged(node)
	}
}

// expire frees, every quarter of the grace, the state of the nodes whose last stream closed
// more than the grace ago, until Close.
func (s *Stack) expire() {
	defer close(s.done)
	tick := time.NewTicker(max(s.grace/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		for _, node := range s.Nodes.Expire(time.Now().Add(-s.grace)) {
			s.Cache.ForgetNode(node)
			if s.Holds != nil {
				s.Holds.Forget(node)
			}
			if s.forget != nil {
				s.forget(node)
			}
		}
	}
}

// Callbacks returns the server callbacks that follow each stream: pass them to
// server.NewServer. Each stream callback, SotW and delta, calls the stack's and then next's (may
// be nil).
func (s *Stack) Callbacks(next server.Callbacks) server.Callbacks {
	if next == nil {
		next = server.CallbackFuncs{}
	}
	return &callbacks{Callbacks: next, t: s.Tracker}
}

type callbacks struct {
	server.Callbacks
	t *engine.Tracker
}

func (cb *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, typeURL string) error {
	if err := cb.t.OnDeltaStreamOpen(ctx, id, typeURL); err != nil {
		return err
	}
	return cb.Callbacks.OnDeltaStreamOpen(ctx, id, typeURL)
}

func (cb *callbacks) OnDeltaStreamClosed(id int64, node *core.Node) {
	cb.t.OnDeltaStreamClosed(id, node)
	cb.Callbacks.OnDeltaStreamClosed(id, node)
}

func (cb *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	if err := cb.t.OnStreamDeltaRequest(id, req); err != nil {
		return err
	}
	return cb.Callbacks.OnStreamDeltaRequest(id, req)
}

func (cb *callbacks) OnStreamDeltaResponse(id int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	cb.t.OnStreamDeltaResponse(id, req, resp)
	cb.Callbacks.OnStreamDeltaResponse(id, req, resp)
}

func (cb *callbacks) OnStreamOpen(ctx context.Context, id int64, typeURL string) error {
	if err := cb.t.OnStreamOpen(ctx, id, typeURL); err != nil {
		return err
	}
	return cb.Callbacks.OnStreamOpen(ctx, id, typeURL)
}

func (cb *callbacks) OnStreamClosed(id int64, node *core.Node) {
	cb.t.OnStreamClosed(id, node)
	cb.Callbacks.OnStreamClosed(id, node)
}

func (cb *callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	if err := cb.t.OnStreamRequest(id, req); err != nil {
		return err
	}
	return cb.Callbacks.OnStreamRequest(id, req)
}

func (cb *callbacks) OnStreamResponse(ctx context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	cb.t.OnStreamResponse(ctx, id, req, resp)
	cb.Callbacks.OnStreamResponse(ctx, id, req, resp)
}

func (cb *callbacks) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	return cb.t.OnFetchRequest(ctx, req)
}

package guard

// What an adopter gives the guard, checked once in the constructor.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared"
)

// Options tune a Guard or a Cache. The zero value guards with the built-in retry policy and
// reference holds on. New and NewCache refuse a negative duration or bound (except
// MaxStreamsPerNode) with an error that names the option.
type Options struct {
	// Plugins are go-plugin binaries serving kds-host's RetryForcer, OwnerCheck or both (for
	// example the reference retry-forcer), started, pinned by checksum and supervised by the
	// guard (package policy); Close stops them. A plugin that serves the retry policy replaces
	// RetryPolicy and Fallback, one that serves the owner check replaces OwnerCheck: set one or
	// the other, not both. Their metrics are part of Collector.
	Plugins []policy.Plugin
	// RetryPolicy returns the RetryForcer in force, asked at every decision (a plugin that can
	// be reloaded or swapped); nil: the built-in policy. On any failure the built-in policy
	// decides.
	RetryPolicy func() shared.RetryForcer
	// Fallback is the policy that decides when RetryPolicy fails or misses its deadline (nil: the
	// built-in policy with its defaults).
	Fallback shared.RetryForcer
	// PolicyTimeout is the deadline of one policy call (default 200ms).
	PolicyTimeout time.Duration
	// NoHolds turns the guard's own holds off (Owners, the warm-up routes, kept removals): a
	// resource is sent whether or not the client has what it references. OwnerCheck still
	// applies.
	NoHolds bool
	// OwnerCheck, if set, returns the OwnerCheck policy in force, asked before a resource version
	// goes to a client: ACCEPT sends it, WAIT and REJECT keep the version the client has, with
	// the policy's reason. On the policy's wire a candidate's kind is its type URL and its owners
	// are what Owners says it references; the inventory is what the client ACKed. On an error or
	// past OwnerCheckTimeout (default 1s) the guard sends what it asked about (fail-open).
	OwnerCheck        func() shared.OwnerCheck
	OwnerCheckTimeout time.Duration
	// Owners says what a resource references (default: EnvoyReferences; NewCache: nothing).
	Owners func(typeURL string, r Resource) []Ref
	// Logger logs refusals and decisions (default: none).
	Logger *slog.Logger
	// Metrics name what Collector exports, <Namespace>_nacks_total and so on (default
	// namespace "xds_guard"), each with its ConstLabels: two guards with their own labels share
	// one registry.
	Metrics policy.Metrics
	// NodeIndependent says the wrapped cache answers every node alike: a MuxCache of
	// LinearCaches chosen by type URL, as most servers with a cache per type have it. The guard
	// then keeps one watch of it per type, shared by every stream, instead of one per stream and
	// type: the cache works for one watch, and each of its answers is read once. A LinearCache
	// is known to be, and needs no telling. New refuses it over a SnapshotCache, which answers
	// by node; leave it false for a MuxCache that chooses by node.
	NodeIndependent bool

	// Bounds of what one client stream may make the guard and the server it wraps hold, checked
	// in the request callbacks, before the server stores anything of a request: a request past
	// one is refused with ResourceExhausted, counted in <namespace>_refusals_total{reason="limit"}
	// (Collector) and logged (a few lines a second). The bytes of one request are the gRPC
	// server's to bound (grpc.MaxRecvMsgSize, 4 MiB unless set), and so are the streams of one
	// connection (grpc.MaxConcurrentStreams). NewCache reads none of these: it serves one stream
	// per node id, only its types, and bounds the names it does not hold.
	//
	// MaxTypesPerStream bounds the type URLs one stream asks for (default 32; xDS has about ten).
	MaxTypesPerStream int
	// MaxNamesPerStream bounds the resource names one stream asks for, across its types (default
	// 100,000): the names a SotW request lists, a delta stream's subscribed names, and the names
	// of a delta type's initial_resource_versions that it does not subscribe to (counted for the
	// stream's life).
	MaxNamesPerStream int
	// MaxStreamsPerNode bounds the streams open at once with one node id, SotW and delta
	// together (default 64; negative: no bound); clients that share a node id share it.
	MaxStreamsPerNode int
}

// check refuses what no default makes sense of, naming the option.
func (o *Options) check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PolicyTimeout", o.PolicyTimeout}, {"OwnerCheckTimeout", o.OwnerCheckTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("guard: Options.%s %v: want a positive duration, or 0 for the default", d.name, d.v)
		}
	}
	for _, b := range []struct {
		name string
		v    int
	}{{"MaxTypesPerStream", o.MaxTypesPerStream}, {"MaxNamesPerStream", o.MaxNamesPerStream}} {
		if b.v < 0 {
			return fmt.Errorf("guard: Options.%s %d: want a positive bound, or 0 for the default", b.name, b.v)
		}
	}
	if len(o.Plugins) > 0 && (o.RetryPolicy != nil || o.Fallback != nil || o.OwnerCheck != nil) {
		return errors.New("guard: Options.Plugins and Options.RetryPolicy, Fallback or OwnerCheck: set the plugins or the policies, not both")
	}
	if o.Metrics.Namespace == "" {
		o.Metrics.Namespace = policy.DefaultNamespace
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// checkInner refuses NodeIndependent over a cache that answers by node.
func (o *Options) checkInner(inner cache.Cache) error {
	if _, byNode := inner.(cache.SnapshotCache); byNode && o.NodeIndependent {
		return errors.New("guard: Options.NodeIndependent over a SnapshotCache: it answers each node with its own snapshot, and one shared watch would serve one node's resources to every other; leave NodeIndependent false")
	}
	return nil
}

// openPlugins starts Options.Plugins, if any, and sets the policies they serve; the runtime is
// nil without plugins.
func (o *Options) openPlugins() (*policy.Runtime, error) {
	if len(o.Plugins) == 0 {
		return nil, nil
	}
	rt, err := policy.Open(context.Background(), o.Plugins, policy.Options{Logger: o.Logger, Metrics: o.Metrics})
	if err != nil {
		return nil, fmt.Errorf("guard: Options.Plugins: %w", err)
	}
	o.RetryPolicy, o.Fallback = rt.RetryForcer, rt.Fallback()
	for _, st := range rt.Status() {
		if st.Name != policy.Builtin && slices.Contains(st.Serves, policy.OwnerCheckService) {
			o.OwnerCheck = rt.OwnerCheck
		}
	}
	return rt, nil
}

// metricName is name in the options' namespace.
func (o *Options) metricName(name string) string {
	return strings.Trim(o.Metrics.Namespace, "_") + "_" + name
}

// descs are the guard's metrics, named by its options.
type descs struct {
	nacks, responses, withheld, clients, refusals *prometheus.Desc
}

func (o *Options) descs() descs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(o.metricName(name), help, labels, o.Metrics.ConstLabels)
	}
	return descs{
		nacks:     d("nacks_total", "NACKs received from clients, by type.", "type_url"),
		responses: d("responses_total", "Responses sent to clients, by type.", "type_url"),
		withheld:  d("withheld_resources", "Resource versions clients do not get now (refused, or waiting for what they reference), by type.", "type_url"),
		clients:   d("clients", "Open client streams."),
		refusals:  d("refusals_total", "Client streams refused: past a bound (limit), a type not served (invalid), or, with NewCache, replaced by a newer stream of the node (replaced).", "reason"),
	}
}

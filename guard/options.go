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
	// Plugins are go-plugin binaries serving kds-host's RetryForcer, OwnerCheck or both, started,
	// pinned by checksum and supervised by the guard (package policy) until Close. They replace
	// RetryPolicy, Fallback and OwnerCheck: set the plugins or those, not both.
	Plugins []policy.Plugin
	// RetryPolicy returns the RetryForcer in force, asked at every decision (nil: the built-in
	// policy); Fallback decides when it fails or misses PolicyTimeout (nil: the built-in policy).
	RetryPolicy func() shared.RetryForcer
	Fallback    shared.RetryForcer
	// PolicyTimeout is the deadline of one policy call (default 200ms).
	PolicyTimeout time.Duration
	// NoHolds turns the guard's own holds off (Owners, warm-up routes, kept removals), not OwnerCheck.
	NoHolds bool
	// OwnerCheck, if set, returns the OwnerCheck policy in force, asked before a resource version
	// goes to a client: ACCEPT sends it, WAIT and REJECT keep the version the client has. A
	// candidate's kind is its type URL, its owners what Owners says; on an error or past
	// OwnerCheckTimeout (default 1s) the version is sent (fail-open).
	OwnerCheck        func() shared.OwnerCheck
	OwnerCheckTimeout time.Duration
	// Owners says what a resource references (default: EnvoyReferences; NewCache: nothing).
	Owners func(typeURL string, r Resource) []Ref
	// Logger logs refusals and decisions (default: none).
	Logger *slog.Logger
	// Metrics name what Collector exports: <Namespace>_nacks_total ... (default "xds_guard").
	Metrics policy.Metrics
	// NodeIndependent says the wrapped cache answers every node alike: one watch of it per type
	// serves every stream (New refuses it over a SnapshotCache). A LinearCache, or a MuxCache of
	// LinearCaches, needs no telling; a stream such a MuxCache routes apart from its shared watch's
	// node is then refused (FailedPrecondition): give it NodeHash (cache.IDHash{}: a watch per node).
	NodeIndependent bool
	// NodeHash is the wrapped per-node cache's node hash, the one NewSnapshotCache was given:
	// the guard keeps one watch of the cache per ID it makes, shared by the streams of every
	// node it maps there (nil: one per node id, as cache.IDHash). Give it only the cache's own:
	// a coarser one serves one node's resources to another.
	NodeHash cache.NodeHash

	// Bounds of one client stream's requests (New only): a request past one is refused with
	// ResourceExhausted before the server stores it, counted in <namespace>_refusals_total.
	//
	// MaxTypesPerStream bounds the type URLs one stream asks for (default 32).
	MaxTypesPerStream int
	// MaxNamesPerStream bounds the resource names one stream asks for across its types (default
	// 100,000), a delta stream's initial_resource_versions it does not subscribe to included.
	MaxNamesPerStream int
	// MaxStreamsPerNode bounds the streams open at once with one node id, SotW and delta
	// together (default 64; negative: no bound).
	MaxStreamsPerNode int
}

// check refuses what no default makes sense of, naming the option, and sets Metrics' and
// Logger's defaults.
func (o *Options) check() error {
	negative := func(name string, v any, what string) error {
		return fmt.Errorf("guard: Options.%s %v: want a positive %s, or 0 for the default", name, v, what)
	}
	switch {
	case o.PolicyTimeout < 0:
		return negative("PolicyTimeout", o.PolicyTimeout, "duration")
	case o.OwnerCheckTimeout < 0:
		return negative("OwnerCheckTimeout", o.OwnerCheckTimeout, "duration")
	case o.MaxTypesPerStream < 0:
		return negative("MaxTypesPerStream", o.MaxTypesPerStream, "bound")
	case o.MaxNamesPerStream < 0:
		return negative("MaxNamesPerStream", o.MaxNamesPerStream, "bound")
	case o.NodeIndependent && o.NodeHash != nil:
		return errors.New("guard: Options.NodeIndependent and Options.NodeHash: a cache that answers every node alike has no node hash; set one or the other")
	case len(o.Plugins) > 0 && (o.RetryPolicy != nil || o.Fallback != nil || o.OwnerCheck != nil):
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

// openPlugins starts Options.Plugins and sets the policies they serve (nil, nil without plugins).
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

// descs are the guard's metrics, named by its options.
type descs struct {
	nacks, responses, withheld, clients, refusals *prometheus.Desc
}

func (o *Options) descs() descs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(strings.Trim(o.Metrics.Namespace, "_")+"_"+name, help, labels, o.Metrics.ConstLabels)
	}
	return descs{
		nacks:     d("nacks_total", "NACKs received from clients, by type.", "type_url"),
		responses: d("responses_total", "Responses sent to clients, by type.", "type_url"),
		withheld:  d("withheld_resources", "Resource versions clients do not get now (refused, or waiting for what they reference), by type.", "type_url"),
		clients:   d("clients", "Open client streams."),
		refusals:  d("refusals_total", "Client streams refused: past a bound (limit), a type not served or a node the shared MuxCache routes apart (invalid), or, with NewCache, replaced by a newer stream of the node (replaced).", "reason"),
	}
}

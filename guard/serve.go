package guard

// What New and NewCache share: the engine they drive (internal/stack), its callbacks, the
// insight and the counts. They differ only in where the engine's snapshots come from.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/internal/lograte"
	"github.com/kds-host/kds-host/internal/stack"
	"github.com/kds-host/kds-host/policy"
)

// serving is the engine a Guard or a Cache serves from, with the plugins, counts and log it
// keeps for the adopter.
type serving struct {
	s        *stack.Stack
	rt       *policy.Runtime // Options.Plugins'; nil without
	descs    descs
	totals   totals
	refusals *lograte.Log // refused streams, a few lines a second per reason
	closed   sync.Once
	before   func() // Close runs it first (New: stops its watches of the wrapped cache)
	// checkWording: an owner check's hold reads "owner check: ..." (New's), not "WAIT: ..."
	checkWording bool
}

// newServing assembles the engine for types (with limits), and opens opts' plugins.
func newServing(types []string, opts *Options, limits engine.Limits) (_ *serving, err error) {
	rt, err := opts.openPlugins()
	if err != nil {
		return nil, err
	}
	v := &serving{rt: rt, descs: opts.descs(), refusals: lograte.New(opts.Logger, time.Second, refusalLines, "reason")}
	v.s, err = stack.New(stack.Config{Types: types, Logger: opts.Logger, RetryPolicy: opts.RetryPolicy, Fallback: opts.Fallback,
		PolicyTimeout: opts.PolicyTimeout, OwnerCheck: opts.OwnerCheck, OwnerCheckTimeout: opts.OwnerCheckTimeout,
		Observers: []event.Observer{v.counter()}, Limits: limits})
	if err != nil {
		v.refusals.Close()
		if rt != nil {
			rt.Close()
		}
		return nil, err
	}
	if !opts.NoHolds {
		v.s.Cache.SetWithholder(newEnvoyHolds())
	}
	v.s.Cache.OnUnbound(func(err error) {
		v.totals.add(&v.totals.refusals, "unbound")
		v.refusals.Log("unbound", slog.LevelError, "xDS request refused: the server was made without the cache's Callbacks", "error", err)
	})
	return v, nil
}

// Close stops the watches of a wrapped cache, the client expiry, the owner checks, the retry
// decisions in flight, every stream's sender and the plugins. A second Close does nothing.
func (v *serving) Close() {
	v.closed.Do(func() {
		if v.before != nil {
			v.before()
		}
		v.s.Close()
		v.refusals.Close()
		if v.rt != nil {
			v.rt.Close()
		}
	})
}

// CreateWatch implements cache.ConfigWatcher for the state-of-the-world server.
func (v *serving) CreateWatch(req *discovery.DiscoveryRequest, sub cache.Subscription, out chan cache.Response) (func(), error) {
	return v.s.Cache.CreateWatch(req, sub, out)
}

// CreateDeltaWatch implements cache.ConfigWatcher for the delta server.
func (v *serving) CreateDeltaWatch(req *discovery.DeltaDiscoveryRequest, sub cache.Subscription, out chan cache.DeltaResponse) (func(), error) {
	return v.s.Cache.CreateDeltaWatch(req, sub, out)
}

// Codec is gRPC's "proto" codec, except that a resource version is encoded once for every
// client that is sent it: give it to the gRPC server, grpc.NewServer(grpc.ForceServerCodecV2(c.Codec())).
func (v *serving) Codec() encoding.CodecV2 { return v.s.Cache.Codec() }

// counter counts NACKs and responses by type, and refused streams by reason, for the collector,
// and logs refused streams (a few lines a second per reason).
func (v *serving) counter() event.Observer {
	return event.Observer{
		NACK: func(n event.NACK) { v.totals.add(&v.totals.nacks, n.TypeURL) },
		Sent: func(s event.Sent) { v.totals.add(&v.totals.responses, s.TypeURL) },
		Refused: func(r event.Refusal) {
			v.totals.add(&v.totals.refusals, r.Reason)
			v.refusals.Log(r.Reason, slog.LevelWarn, "xDS stream refused", "reason", r.Reason, "node", r.Node, "detail", r.Detail)
		},
	}
}

// clients is every connected client's insight, as client makes it of the engine's node (its
// key, for New) and stream.
func (v *serving) clients(client func(node string, stream int64) ClientInsight) []ClientInsight {
	out := []ClientInsight{}
	for _, z := range v.s.Nodes.Insights() {
		if !z.Connected {
			continue
		}
		ci := client(z.Node, z.Stream)
		held := map[string][]Withheld{}
		if v.s.Holds != nil {
			for _, w := range v.s.Holds.Withheld(z.Node) {
				reason := w.Verdict + ": " + w.Reason
				switch waiting := w.WaitingFor != (engine.Ref{}); {
				case v.checkWording && waiting:
					reason = fmt.Sprintf("owner check: waiting for %s %q", shortType(w.WaitingFor.TypeURL), w.WaitingFor.Name)
				case v.checkWording:
					reason = "owner check: " + reason
				case waiting:
					reason = w.Verdict + ": waiting for " + w.WaitingFor.TypeURL + "/" + w.WaitingFor.Name
				}
				held[w.Key.TypeURL] = append(held[w.Key.TypeURL], Withheld{Name: w.Key.Name, Reason: reason})
			}
		}
		for _, k := range z.Types {
			ti := &TypeInsight{TypeURL: k.TypeURL, Responses: k.Responses, ACKs: k.ACKs, NACKs: k.NACKs, Resent: k.Resent, LastError: k.LastError, Withheld: held[k.TypeURL]}
			for _, h := range k.Holds {
				ti.Withheld = append(ti.Withheld, Withheld{Name: h.Name, Version: h.Version, Reason: h.Reason})
			}
			for _, r := range k.Rejected {
				ti.Withheld = append(ti.Withheld, Withheld{Name: r.Name, Version: r.Version, Reason: "refused by the client: " + r.Reason})
			}
			ci.Types = append(ci.Types, ti)
		}
		slices.SortFunc(ci.Types, func(a, b *TypeInsight) int { return strings.Compare(a.TypeURL, b.TypeURL) })
		out = append(out, ci)
	}
	return out
}

// refused counts a refused stream by reason, and logs it (refusalLines a second per reason).
func (v *serving) refused(reason, node string, err error) {
	v.totals.add(&v.totals.refusals, reason)
	v.refusals.Log(reason, slog.LevelWarn, "xDS stream refused", "reason", reason, "node", node, "detail", status.Convert(err).Message())
}

// refusalLines bounds the log lines of refused streams of one reason a second.
const refusalLines = 5

// passFetch is next's REST callbacks (the engine serves streams only; New's Fetch is the wrapped
// cache's).
type passFetch struct{ next server.Callbacks }

func (p passFetch) OnFetchRequest(ctx context.Context, req *discovery.DiscoveryRequest) error {
	if p.next != nil {
		return p.next.OnFetchRequest(ctx, req)
	}
	return nil
}

func (p passFetch) OnFetchResponse(req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
	if p.next != nil {
		p.next.OnFetchResponse(req, resp)
	}
}

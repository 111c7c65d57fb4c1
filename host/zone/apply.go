package zone

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/kds-host/kds-host/engine/nack"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// applied is what one response did on the zone.
type applied struct {
	reply    *discovery.DeltaDiscoveryRequest // the ACK or NACK
	stored   []resource.Key                   // the resources stored
	settled  []string                         // the xDS names stored or removed
	rejected []*kdsv1.Rejection
}

// apply stores one response in one transaction and returns the ACK or NACK for it. A refusal
// says why: its admission is not ready, or the transaction failed (TRANSIENT); the database
// lacks its owner (MISSING_OWNER); the content is refused (INVALID).
func (c *Client) apply(ctx context.Context, resp *discovery.DeltaDiscoveryResponse) applied {
	kind := resp.GetTypeUrl()
	out := applied{reply: &discovery.DeltaDiscoveryRequest{TypeUrl: kind, ResponseNonce: resp.GetNonce()}}
	list := &kdsv1.RejectionList{Kind: kind}
	reject := func(name, reason string, cause kdsv1.Cause, owner *kdsv1.ResourceKey) {
		list.Rejections = append(list.Rejections, &kdsv1.Rejection{Name: name, Reason: reason, Cause: cause, MissingOwner: owner})
	}

	var puts []resource.Resource
	names := map[resource.Key]string{}
	outage := c.outage(kind)
	for _, r := range resp.GetResources() {
		name := r.GetName()
		if outage != "" {
			reject(name, outage, kdsv1.Cause_CAUSE_TRANSIENT, nil)
			continue
		}
		res, err := c.decode(kind, r)
		if err != nil {
			reject(name, err.Error(), kdsv1.Cause_CAUSE_INVALID, nil)
			continue
		}
		puts = append(puts, res)
		names[res.Key()] = name
	}
	var deletes []resource.Key
	for _, name := range resp.GetRemovedResources() {
		key := resource.KeyFromXDSName(kind, name)
		deletes = append(deletes, key)
		names[key] = name
	}

	if len(puts)+len(deletes) > 0 {
		failed, err := c.cfg.Store.Apply(ctx, puts, deletes)
		if err != nil {
			// The transaction failed: nothing of the response is stored, removals included.
			for _, r := range puts {
				reject(names[r.Key()], "database: "+err.Error(), kdsv1.Cause_CAUSE_TRANSIENT, nil)
			}
			for _, k := range deletes {
				reject(names[k], "database: the removal failed: "+err.Error(), kdsv1.Cause_CAUSE_TRANSIENT, nil)
			}
		}
		for key, ferr := range failed {
			var mo *store.MissingOwnerError
			if errors.As(ferr, &mo) {
				reject(names[key], ferr.Error(), kdsv1.Cause_CAUSE_MISSING_OWNER, &kdsv1.ResourceKey{Kind: mo.Owner.Kind, Mesh: mo.Owner.Mesh, Name: mo.Owner.Name})
				continue
			}
			reject(names[key], ferr.Error(), kdsv1.Cause_CAUSE_INVALID, nil)
		}
		if err == nil {
			for i := range puts {
				if _, bad := failed[puts[i].Key()]; !bad {
					out.stored = append(out.stored, puts[i].Key())
					out.settled = append(out.settled, names[puts[i].Key()])
				}
			}
			for _, k := range deletes {
				if _, bad := failed[k]; !bad {
					out.settled = append(out.settled, names[k])
				}
			}
			if c.cfg.Applied != nil {
				c.cfg.Applied(kind, out.stored)
			}
		}
	}

	c.mu.Lock()
	c.stats.Responses++
	if len(list.Rejections) == 0 {
		c.stats.ACKs++
		c.mu.Unlock()
		return out
	}
	c.stats.NACKs++
	if c.stats.NACKByKind == nil {
		c.stats.NACKByKind = map[string]int64{}
	}
	c.stats.NACKByKind[kind]++
	c.mu.Unlock()

	sort.Slice(list.Rejections, func(i, j int) bool { return list.Rejections[i].Name < list.Rejections[j].Name })
	out.rejected = list.Rejections
	msg := summary(kind, list)
	c.log.Warn("NACK", "kind", kind, "rejected", len(list.Rejections), "detail", msg)
	if c.cfg.Plain {
		// A plain xDS client: the message a person reads, nothing the global can act on.
		out.reply.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: strings.ToValidUTF8(msg, "\ufffd")}
		return out
	}
	out.reply.ErrorDetail = nackDetail(list, msg)
	return out
}

// nackDetail is a NACK's error_detail. Text from a response or a database may be any bytes,
// which a protobuf string may not hold, so it is made valid UTF-8 first; and should the list
// still not encode, the NACK goes without it (the global then takes the whole response as
// rejected), never as an ACK.
func nackDetail(list *kdsv1.RejectionList, msg string) *rpcstatus.Status {
	valid := func(s string) string { return strings.ToValidUTF8(s, "\ufffd") }
	for _, r := range list.Rejections {
		r.Name, r.Reason = valid(r.Name), valid(r.Reason)
	}
	msg = valid(msg)
	detail, err := nack.Detail(list, msg)
	if err != nil {
		return &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg + " (the rejection list could not be encoded: " + valid(err.Error()) + ")"}
	}
	return detail
}

// decode reads and validates one resource of a response of kind.
func (c *Client) decode(kind string, r *discovery.Resource) (resource.Resource, error) {
	if _, ok := c.cfg.Registry.Get(kind); !ok {
		return resource.Resource{}, fmt.Errorf("unknown kind %q on this zone", kind)
	}
	p, err := kds.Decode(r.GetResource())
	if err != nil {
		return resource.Resource{}, err
	}
	res, err := resource.FromProto(p)
	if err != nil {
		return resource.Resource{}, err
	}
	if res.Kind != kind || res.Key().XDSName() != r.GetName() {
		return resource.Resource{}, fmt.Errorf("resource %s/%s does not match its name %q in a %s response", res.Kind, res.Key().XDSName(), r.GetName(), kind)
	}
	if err := c.cfg.Registry.Validate(&res); err != nil {
		return resource.Resource{}, fmt.Errorf("invalid %s: %w", res.Key(), err)
	}
	for k, v := range c.cfg.AdmissionDeny {
		if res.Labels[k] == v {
			return resource.Resource{}, fmt.Errorf("admission webhook denies %s: label %s=%s is not allowed here (simulated)", res.Key(), k, v)
		}
	}
	return res, nil
}

// outage returns the rejection reason while an admission outage of kind lasts, else "".
func (c *Client) outage(kind string) string {
	d, ok := c.cfg.AdmissionOutage[kind]
	if !ok {
		return ""
	}
	until := c.started.Add(d)
	if time.Now().Before(until) {
		return fmt.Sprintf("admission webhook for %s is not ready (simulated outage until %s)", kind, until.Format(time.RFC3339Nano))
	}
	return ""
}

func summary(kind string, list *kdsv1.RejectionList) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s rejected", len(list.Rejections), kind)
	for i, r := range list.Rejections {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(list.Rejections)-3)
			break
		}
		fmt.Fprintf(&b, "; %s: %s", r.Name, r.Reason)
	}
	return b.String()
}

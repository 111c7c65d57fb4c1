package resource

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

// Key names a resource. Mesh is empty for global-scoped kinds.
type Key struct {
	Kind string `json:"kind"`
	Mesh string `json:"mesh,omitempty"`
	Name string `json:"name"`
}

func (k Key) String() string {
	if k.Mesh == "" {
		return k.Kind + "/" + k.Name
	}
	return k.Kind + "/" + k.Mesh + "/" + k.Name
}

// XDSName is the resource's name inside its kind's xDS type: "name" for a global-scoped
// resource, "mesh/name" for a mesh-scoped one ('/' is not allowed in names, so it is unique).
func (k Key) XDSName() string {
	if k.Mesh == "" {
		return k.Name
	}
	return k.Mesh + "/" + k.Name
}

// KeyFromXDSName is the inverse of Key.XDSName for a kind.
func KeyFromXDSName(kind, name string) Key {
	if mesh, n, ok := strings.Cut(name, "/"); ok {
		return Key{Kind: kind, Mesh: mesh, Name: n}
	}
	return Key{Kind: kind, Name: name}
}

// Resource is one stored or synced object, in the shape of Kuma's API ("type", "mesh", "name").
type Resource struct {
	Kind       string            `json:"type"`
	Mesh       string            `json:"mesh,omitempty"`
	Name       string            `json:"name"`
	Labels     map[string]string `json:"labels,omitempty"`
	Owners     []Key             `json:"owners,omitempty"`
	Spec       json.RawMessage   `json:"spec,omitempty"`
	Generation int64             `json:"generation,omitempty"`
	// CreationTime and ModificationTime are the store's, set when it stores the resource;
	// they are not part of its content (nor of its version).
	CreationTime     time.Time `json:"creationTime,omitzero"`
	ModificationTime time.Time `json:"modificationTime,omitzero"`
}

// Key returns the resource's key.
func (r *Resource) Key() Key { return Key{Kind: r.Kind, Mesh: r.Mesh, Name: r.Name} }

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// ValidationError names the field that is wrong.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Reason }

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks the resource against its kind (its spec against the kind's schema) and
// normalises it: the spec becomes compact JSON ("{}" when absent and not required). It returns
// a *ValidationError naming the first bad field by its full path ("spec.to[0].default.x").
func (reg *Registry) Validate(r *Resource) error {
	if r.Kind == "" {
		return invalid("type", "is required (one of %s)", reg.KnownNames())
	}
	k, ok := reg.Get(r.Kind)
	if !ok {
		return invalid("type", "unknown kind %q (known: %s)", r.Kind, reg.KnownNames())
	}
	if !nameRE.MatchString(r.Name) {
		return invalid("name", "%q must be lower-case letters, digits, '-' or '.', start and end with a letter or digit, at most 253 characters", r.Name)
	}
	switch k.Scope {
	case ScopeGlobal:
		if r.Mesh != "" {
			return invalid("mesh", "%s is global-scoped and takes no mesh (got %q)", k.Name, r.Mesh)
		}
	case ScopeMesh:
		if r.Mesh == "" {
			return invalid("mesh", "is required for %s", k.Name)
		}
		if !nameRE.MatchString(r.Mesh) {
			return invalid("mesh", "%q is not a valid mesh name", r.Mesh)
		}
	}
	if err := validLabels(r.Labels); err != nil {
		return err
	}
	for i, o := range r.Owners {
		if _, ok := reg.Get(o.Kind); !ok {
			return invalid(fmt.Sprintf("owners[%d].kind", i), "unknown kind %q", o.Kind)
		}
		if o.Name == "" {
			return invalid(fmt.Sprintf("owners[%d].name", i), "is required")
		}
	}
	spec := map[string]any{}
	if len(r.Spec) > 0 && string(r.Spec) != "null" {
		if err := json.Unmarshal(r.Spec, &spec); err != nil {
			return invalid("spec", "must be a JSON object: %v", err)
		}
	} else if k.SpecRequired {
		return invalid("spec", "is required for %s", k.Name)
	}
	if k.Validate != nil {
		if err := k.Validate(spec); err != nil {
			var ve *ValidationError
			if errors.As(err, &ve) {
				return invalid(join("spec", ve.Field), "%s", ve.Reason)
			}
			return invalid("spec", "%v", err)
		}
	}
	compact, err := json.Marshal(spec)
	if err != nil {
		return invalid("spec", "%v", err)
	}
	r.Spec = compact
	return nil
}

// Labels follow Kubernetes' rules (as Kuma's do): a key is an optional DNS subdomain prefix of at
// most 253 characters and a slash, then a name of at most 63 characters of letters, digits, '-',
// '_' and '.', starting and ending with a letter or digit; a value is empty or such a name.
var (
	labelNameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// MaxLabels bounds the labels of one resource.
const MaxLabels = 64

func validLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalid("labels", "%d labels; at most %d", len(labels), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) { // the first bad one, the same each time
		field := fmt.Sprintf("labels[%q]", short(k))
		name := k
		if prefix, n, ok := strings.Cut(k, "/"); ok {
			if len(prefix) > 253 || !labelPrefixRE.MatchString(prefix) {
				return invalid(field, "the key's prefix must be a DNS subdomain (lower-case letters, digits, '-' and '.'), at most 253 characters")
			}
			name = n
		}
		if !labelNameRE.MatchString(name) {
			return invalid(field, "the key's name must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
		}
		if v := labels[k]; v != "" && !labelNameRE.MatchString(v) {
			return invalid(field, "the value must be empty or 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (%d bytes given)", len(v))
		}
	}
	return nil
}

// short is s cut to 64 bytes for an error message.
func short(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "..."
}

// ToProto returns the wire form of a validated resource.
func (r *Resource) ToProto() (*kdsv1.Resource, error) {
	spec := &structpb.Struct{}
	if len(r.Spec) > 0 {
		if err := spec.UnmarshalJSON(r.Spec); err != nil {
			return nil, fmt.Errorf("%s: spec: %w", r.Key(), err)
		}
	}
	owners := make([]*kdsv1.ResourceKey, 0, len(r.Owners))
	for _, o := range r.Owners {
		owners = append(owners, &kdsv1.ResourceKey{Kind: o.Kind, Mesh: o.Mesh, Name: o.Name})
	}
	return &kdsv1.Resource{
		Kind: r.Kind, Name: r.Name, Mesh: r.Mesh, Labels: r.Labels,
		Owners: owners, Spec: spec, Generation: r.Generation,
	}, nil
}

// FromProto is the inverse of ToProto.
func FromProto(p *kdsv1.Resource) (Resource, error) {
	r := Resource{Kind: p.GetKind(), Mesh: p.GetMesh(), Name: p.GetName(), Labels: p.GetLabels(), Generation: p.GetGeneration()}
	for _, o := range p.GetOwners() {
		r.Owners = append(r.Owners, Key{Kind: o.GetKind(), Mesh: o.GetMesh(), Name: o.GetName()})
	}
	spec := []byte("{}")
	if p.GetSpec() != nil {
		b, err := json.Marshal(p.GetSpec().AsMap())
		if err != nil {
			return Resource{}, fmt.Errorf("%s: spec: %w", r.Key(), err)
		}
		spec = b
	}
	r.Spec = spec
	return r, nil
}

// Version is the content version of a wire resource: a hash of its deterministic encoding,
// without the generation. Equal content has an equal version across restarts and replicas, so a
// zone that reconnects with initial_resource_versions is sent only what changed.
func Version(p *kdsv1.Resource) string {
	c := proto.Clone(p).(*kdsv1.Resource)
	c.Generation = 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		// A message built by ToProto always marshals; an unversionable one is always "sent".
		return "unversioned"
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// OwnerKeys returns every owner of r: its Mesh for a mesh-scoped kind, then its explicit owners.
func (r *Resource) OwnerKeys() []Key {
	var out []Key
	if r.Mesh != "" {
		out = append(out, Key{Kind: MeshKind, Name: r.Mesh})
	}
	return append(out, r.Owners...)
}

// MeshDefaults returns the policies that creating a Mesh creates, as Kuma does.
func MeshDefaults(mesh string) []Resource {
	return []Resource{
		{Kind: "MeshTimeout", Mesh: mesh, Name: "mesh-timeout-all-default", Labels: defaultLabels(),
			Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh"},"from":[{"targetRef":{"kind":"Mesh"},"default":{"connectionTimeout":"5s","idleTimeout":"2h","http":{"requestTimeout":"15s","streamIdleTimeout":"30m","maxStreamDuration":"0s"}}}]}`)},
		{Kind: "MeshTimeout", Mesh: mesh, Name: "mesh-gateways-timeout-all-default", Labels: defaultLabels(),
			Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh","proxyTypes":["Gateway"]},"from":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"5m","http":{"streamIdleTimeout":"5s","requestHeadersTimeout":"500ms"}}}]}`)},
		{Kind: "MeshRetry", Mesh: mesh, Name: "mesh-retry-all-default", Labels: defaultLabels(),
			Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"tcp":{"maxConnectAttempt":5},"http":{"numRetries":5,"perTryTimeout":"16s","backOff":{"baseInterval":"25ms","maxInterval":"250ms"}}}}]}`)},
		{Kind: "MeshCircuitBreaker", Mesh: mesh, Name: "mesh-circuit-breaker-all-default", Labels: defaultLabels(),
			Spec: json.RawMessage(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"connectionLimits":{"maxConnections":1024,"maxPendingRequests":1024,"maxRequests":1024,"maxRetries":3},"outlierDetection":{"disabled":false,"interval":"10s","baseEjectionTime":"30s"}}}]}`)},
	}
}

func defaultLabels() map[string]string {
	return map[string]string{"kuma.io/origin": "global", "kds-host.io/default": "true"}
}

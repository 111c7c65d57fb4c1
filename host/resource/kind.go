// Package resource is kds-host's resource model: the registry of kinds (as data), the Resource
// type with its key and validation, its wire form (kds.v1.Resource) and its content version.
package resource

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Scope says where a kind lives: globally (Mesh) or inside a Mesh (policies).
type Scope int

const (
	ScopeGlobal Scope = iota
	ScopeMesh
)

func (s Scope) String() string {
	if s == ScopeMesh {
		return "mesh"
	}
	return "global"
}

// MeshKind is the one kind every mesh-scoped resource belongs to.
const MeshKind = "Mesh"

// Kind describes one resource kind. Adding a kind is one Kind value.
type Kind struct {
	// Name is the kind's name, e.g. "MeshTimeout"; it is also the kind's xDS type URL.
	Name string
	// Plural is the lower-case plural used in API paths and the CLI, e.g. "meshtimeouts".
	Plural string
	Scope  Scope
	// Owner is the kind that owns every resource of this kind ("Mesh" for mesh-scoped kinds).
	Owner string
	// SpecRequired refuses a resource without a spec (absent or null); "{}" is a spec.
	SpecRequired bool
	// Validate checks the spec (a decoded JSON object); nil accepts any object. An error that is
	// a *ValidationError names its field relative to the spec ("to[0].default").
	Validate func(spec map[string]any) error
}

// Registry holds the known kinds. The zero value is empty; Default returns the built-in set.
// It is safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex // guards byName, byPlural and order
	byName   map[string]*Kind
	byPlural map[string]*Kind
	order    []string
}

// Register adds a kind. A duplicate name or plural is an error.
func (r *Registry) Register(k Kind) error {
	if k.Name == "" || k.Plural == "" {
		return fmt.Errorf("register kind: name and plural are required")
	}
	if k.Scope == ScopeMesh && k.Owner == "" {
		k.Owner = MeshKind
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byName == nil {
		r.byName, r.byPlural = map[string]*Kind{}, map[string]*Kind{}
	}
	if _, ok := r.byName[k.Name]; ok {
		return fmt.Errorf("register kind %s: already registered", k.Name)
	}
	if _, ok := r.byPlural[k.Plural]; ok {
		return fmt.Errorf("register kind %s: plural %q already registered", k.Name, k.Plural)
	}
	kk := k
	r.byName[k.Name], r.byPlural[k.Plural] = &kk, &kk
	r.order = append(r.order, k.Name)
	return nil
}

// MustRegister is Register for tables known to be valid at init time.
func (r *Registry) MustRegister(kinds ...Kind) *Registry {
	for _, k := range kinds {
		if err := r.Register(k); err != nil {
			panic(err)
		}
	}
	return r
}

// Get returns the kind with that name.
func (r *Registry) Get(name string) (Kind, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	k, ok := r.byName[name]
	if !ok {
		return Kind{}, false
	}
	return *k, true
}

// Lookup finds a kind by name, plural or singular, case-insensitively: "MeshTimeout",
// "meshtimeout", "meshtimeouts" all name the same kind (as on a kubectl command line).
func (r *Registry) Lookup(s string) (Kind, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if k, ok := r.byName[s]; ok {
		return *k, true
	}
	ls := strings.ToLower(s)
	if k, ok := r.byPlural[ls]; ok {
		return *k, true
	}
	for _, k := range r.byName {
		if strings.ToLower(k.Name) == ls {
			return *k, true
		}
	}
	return Kind{}, false
}

// Names returns the kind names in registration order (Mesh first for the default registry).
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]string(nil), r.order...)
}

// Kinds returns the kinds in registration order.
func (r *Registry) Kinds() []Kind {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Kind, 0, len(r.order))
	for _, n := range r.order {
		out = append(out, *r.byName[n])
	}
	return out
}

// KnownNames lists the names, sorted, for error messages.
func (r *Registry) KnownNames() string {
	n := r.Names()
	sort.Strings(n)
	return strings.Join(n, ", ")
}

// Plural is the API plural of a kind name: lower case, "y" after a consonant becomes "ies"
// (MeshRetry: meshretries), "s", "x" and "sh" take "es", the rest take "s".
func Plural(name string) string {
	l := strings.ToLower(name)
	switch {
	case strings.HasSuffix(l, "y") && len(l) > 1 && !strings.ContainsRune("aeiou", rune(l[len(l)-2])):
		return l[:len(l)-1] + "ies"
	case strings.HasSuffix(l, "s"), strings.HasSuffix(l, "x"), strings.HasSuffix(l, "sh"):
		return l + "es"
	}
	return l + "s"
}

// Default returns a registry with Mesh and the built-in policy kinds, each with its schema
// (policies.go): a policy needs a spec, a Mesh does not.
func Default() *Registry {
	schemas := builtinSchemas()
	r := &Registry{}
	r.MustRegister(Kind{Name: MeshKind, Plural: "meshes", Scope: ScopeGlobal, Validate: schemas[MeshKind].validator()})
	for _, name := range []string{
		"MeshTimeout", "MeshRetry", "MeshCircuitBreaker", "MeshHealthCheck", "MeshRateLimit",
		"MeshTrafficPermission", "MeshAccessLog", "MeshFaultInjection",
	} {
		r.MustRegister(Kind{Name: name, Plural: Plural(name), Scope: ScopeMesh, SpecRequired: true, Validate: schemas[name].validator()})
	}
	return r
}

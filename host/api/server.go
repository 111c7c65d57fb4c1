// Package api is kds-host's HTTP API, in the shape of Kuma's: resources are read and written at
// /meshes/{name} and /meshes/{mesh}/{plural}/{name}, over a store.Store.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/host/store"
)

// Config configures a Server. Store is required; the zero value of every other field works.
type Config struct {
	Store store.Store
	// Registry holds the kinds served; nil serves resource.Default().
	Registry *resource.Registry
	// ReadOnly refuses writes, as a zone does: its resources come from the global.
	ReadOnly bool
	// Logger may be nil.
	Logger hclog.Logger
	// Version and Mode are reported by GET /. An empty Mode is "zone" when ReadOnly, else "global".
	Version string
	Mode    string
	// StoreTimeout bounds the store's work for one request (default 5s; a batch, POST /api/apply,
	// six times as long: up to 1,000 resources in one transaction): past it the request answers
	// 503 with Retry-After, instead of waiting on a locked table or a store that is down.
	StoreTimeout time.Duration
	// MaxResourceWireBytes, if set, refuses a resource whose KDS encoding is larger (the global's
	// --kds-max-message: a resource goes to zones in one response at least).
	MaxResourceWireBytes int
}

// Server serves the API. Other parts of the control plane add their routes with Handle.
type Server struct {
	store    store.Store
	reg      *resource.Registry
	readOnly bool
	log      hclog.Logger
	version  string
	mode     string
	maxWire  int
	timeout  time.Duration
	mux      *http.ServeMux
}

// ResultHeader is the response header of a PUT that says what it did: created, updated or
// unchanged (a write of identical content).
const ResultHeader = "Kds-Result"

// Outcome is what a PUT did.
type Outcome string

const (
	Created   Outcome = "created"
	Updated   Outcome = "updated"
	Unchanged Outcome = "unchanged"
)

// List is the body of a list answer: Items, and Total counting them. Unreadable names the stored
// rows of the list that the store cannot read (not in Items).
type List struct {
	Items      []resource.Resource `json:"items"`
	Total      int                 `json:"total"`
	Unreadable []UnreadableRow     `json:"unreadable,omitempty"`
}

// UnreadableRow is a stored row the store cannot read: its column that cannot be read, and why.
type UnreadableRow struct {
	Mesh   string `json:"mesh,omitempty"`
	Name   string `json:"name"`
	Column string `json:"column"`
	Error  string `json:"error"`
}

// KindInfo describes one kind in the answer of GET /_resources.
type KindInfo struct {
	Name string `json:"name"`
	// Path is the kind's plural, the path segment of its routes.
	Path string `json:"path"`
	// Scope is "Global" or "Mesh".
	Scope string `json:"scope"`
}

// Kinds is the body of GET /_resources.
type Kinds struct {
	Resources []KindInfo `json:"resources"`
}

// Index is the body of GET /.
type Index struct {
	Product string `json:"product"`
	Version string `json:"version"`
	Mode    string `json:"mode"`
}

const readOnlyDetails = "this is a zone control plane: resources are read-only here; apply them on the global"

// New returns a Server over cfg.Store.
func New(cfg Config) *Server {
	s := &Server{
		store:    cfg.Store,
		reg:      cfg.Registry,
		readOnly: cfg.ReadOnly,
		log:      cfg.Logger,
		version:  cfg.Version,
		mode:     cfg.Mode,
		maxWire:  cfg.MaxResourceWireBytes,
		timeout:  cfg.StoreTimeout,
		mux:      http.NewServeMux(),
	}
	if s.reg == nil {
		s.reg = resource.Default()
	}
	if s.timeout <= 0 {
		s.timeout = DefaultStoreTimeout
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	if s.mode == "" {
		s.mode = "global"
		if s.readOnly {
			s.mode = "zone"
		}
	}
	// Patterns carry no method, so that others can mount routes such as "GET /healthz" or
	// "/metrics" without conflicting; each handler dispatches on the method itself.
	s.mux.HandleFunc("POST /api/apply", s.apply)
	s.mux.HandleFunc("/{$}", s.index)
	s.mux.HandleFunc("/_resources", s.kinds)
	s.mux.HandleFunc("/{plural}", func(w http.ResponseWriter, r *http.Request) {
		s.route(w, r, false, "", r.PathValue("plural"), "")
	})
	s.mux.HandleFunc("/{plural}/{name}", func(w http.ResponseWriter, r *http.Request) {
		s.route(w, r, false, "", r.PathValue("plural"), r.PathValue("name"))
	})
	s.mux.HandleFunc("/meshes/{mesh}/{plural}", func(w http.ResponseWriter, r *http.Request) {
		s.route(w, r, true, r.PathValue("mesh"), r.PathValue("plural"), "")
	})
	s.mux.HandleFunc("/meshes/{mesh}/{plural}/{name}", func(w http.ResponseWriter, r *http.Request) {
		s.route(w, r, true, r.PathValue("mesh"), r.PathValue("plural"), r.PathValue("name"))
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &Error{Status: http.StatusNotFound, Title: titleNotFound,
			Details: fmt.Sprintf("no route for %s (resources live at /meshes/{mesh} and /meshes/{mesh}/{plural}/{name})", r.URL.Path)})
	})
	return s
}

// DefaultStoreTimeout bounds the store's work for one request unless configured.
const DefaultStoreTimeout = 5 * time.Second

// Handler returns the handler serving every route; each request's context carries the store
// deadline.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		timeout := s.timeout
		if r.URL.Path == "/api/apply" {
			timeout *= batchTimeoutFactor
		}
		ctx, cancel := context.WithTimeoutCause(r.Context(), timeout, errStoreTimeout)
		defer cancel()
		s.mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// batchTimeoutFactor: a batch's store deadline is this many times a request's.
const batchTimeoutFactor = 6

// errStoreTimeout is the cause of a request's deadline.
var errStoreTimeout = errors.New("the store did not answer in time")

// unavailable is the answer to a request whose store work failed because the store cannot do it
// now: 507 when it has no space left to write, 503 with Retry-After when it did not answer
// within the deadline (down, or a table locked) or is short of resources; nil for another
// failure.
func (s *Server) unavailable(err error) *Error {
	switch {
	case errors.Is(err, store.ErrNoSpace):
		return &Error{Status: http.StatusInsufficientStorage, Title: titleNoSpace,
			Details: fmt.Sprintf("%v: reads still work; writes succeed again once space is freed on the database's disk (or its quota raised), and nothing stored is lost", err)}
	case errors.Is(err, store.ErrInsufficientResources):
		return &Error{Status: http.StatusServiceUnavailable, Title: titleUnavailable, Details: fmt.Sprintf("%v: retry later", err)}
	case !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, errStoreTimeout):
		return nil
	}
	return &Error{Status: http.StatusServiceUnavailable, Title: titleUnavailable,
		Details: fmt.Sprintf("the store did not answer within the request's deadline (%s, a batch %s): it is down or busy; retry later", s.timeout, batchTimeoutFactor*s.timeout)}
}

// Handle adds a route (a net/http ServeMux pattern) to the API, e.g. "GET /api/zones".
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Route is the pattern of the route that serves r ("/meshes/{mesh}/{plural}/{name}", "GET
// /api/zones"), without serving it: a label for metrics that stays bounded whatever the paths.
func (s *Server) Route(r *http.Request) string {
	_, pattern := s.mux.Handler(r)
	return pattern
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	if !s.allow(w, r, http.MethodGet) {
		return
	}
	s.writeJSON(w, r, http.StatusOK, Index{Product: "kds-host", Version: s.version, Mode: s.mode})
}

func (s *Server) kinds(w http.ResponseWriter, r *http.Request) {
	if !s.allow(w, r, http.MethodGet) {
		return
	}
	out := Kinds{Resources: []KindInfo{}}
	for _, k := range s.reg.Kinds() {
		scope := "Global"
		if k.Scope == resource.ScopeMesh {
			scope = "Mesh"
		}
		out.Resources = append(out.Resources, KindInfo{Name: k.Name, Path: k.Plural, Scope: scope})
	}
	s.writeJSON(w, r, http.StatusOK, out)
}

// route resolves the kind of a resource route and dispatches on the method. meshPath says the
// route is under /meshes/{mesh}/; name is empty for a collection.
func (s *Server) route(w http.ResponseWriter, r *http.Request, meshPath bool, mesh, plural, name string) {
	k, ok := s.reg.Lookup(plural)
	if !ok {
		s.writeError(w, r, &Error{Status: http.StatusNotFound, Title: titleNotFound,
			Details: fmt.Sprintf("unknown resource type %q (known: %s)", plural, s.knownPlurals())})
		return
	}
	switch {
	case meshPath && k.Scope == resource.ScopeGlobal:
		s.writeError(w, r, &Error{Status: http.StatusNotFound, Title: titleNotFound,
			Details: fmt.Sprintf("%s is global-scoped: use /%s/{name}", k.Name, k.Plural)})
		return
	case !meshPath && k.Scope == resource.ScopeMesh && name != "":
		s.writeError(w, r, &Error{Status: http.StatusNotFound, Title: titleNotFound,
			Details: fmt.Sprintf("%s is mesh-scoped: use /meshes/{mesh}/%s/{name}", k.Name, k.Plural)})
		return
	}
	if name == "" {
		if s.allow(w, r, http.MethodGet) {
			s.list(w, r, k, mesh)
		}
		return
	}
	key := resource.Key{Kind: k.Name, Mesh: mesh, Name: name}
	methods := []string{http.MethodGet, http.MethodPut, http.MethodDelete}
	if s.readOnly {
		methods = methods[:1]
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.get(w, r, key)
	case http.MethodPut, http.MethodDelete:
		if s.readOnly {
			w.Header().Set("Allow", "GET, HEAD")
			s.writeError(w, r, &Error{Status: http.StatusMethodNotAllowed, Title: titleReadOnly, Details: readOnlyDetails})
			return
		}
		if r.Method == http.MethodPut {
			s.put(w, r, key)
		} else {
			s.delete(w, r, key)
		}
	default:
		s.allow(w, r, methods...)
	}
}

// allow answers 405 and returns false unless the request's method is one of methods (HEAD is
// allowed with GET).
func (s *Server) allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
			return true
		}
	}
	allowed := strings.Join(methods, ", ")
	if len(methods) > 0 && methods[0] == http.MethodGet {
		allowed = strings.Join(append([]string{http.MethodGet, http.MethodHead}, methods[1:]...), ", ")
	}
	w.Header().Set("Allow", allowed)
	details := fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allowed)
	if s.readOnly && (r.Method == http.MethodPut || r.Method == http.MethodDelete) {
		details = readOnlyDetails
	}
	s.writeError(w, r, &Error{Status: http.StatusMethodNotAllowed, Title: titleReadOnly, Details: details})
	return false
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, k resource.Kind, mesh string) {
	items, err := s.store.List(r.Context(), k.Name, mesh)
	bad, err := store.Unreadable(err) // the rest is answered
	if err != nil {
		s.internal(w, r, fmt.Errorf("list %s: %w", k.Plural, err))
		return
	}
	if items == nil {
		items = []resource.Resource{}
	}
	l := List{Items: items, Total: len(items)}
	for _, b := range bad {
		l.Unreadable = append(l.Unreadable, UnreadableRow{Mesh: b.Key.Mesh, Name: b.Key.Name, Column: b.Column, Error: b.Err.Error()})
	}
	s.writeJSON(w, r, http.StatusOK, l)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, key resource.Key) {
	res, err := s.store.Get(r.Context(), key)
	var unreadable *store.ColumnError
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.writeError(w, r, notFound(key))
	case errors.As(err, &unreadable):
		s.writeError(w, r, &Error{Status: http.StatusInternalServerError, Title: titleUnreadable,
			Details: fmt.Sprintf("%s is stored, but its %s cannot be read (%v): apply it again, or delete it", key, unreadable.Column, unreadable.Err),
			Causes:  []Cause{{Field: unreadable.Column, Message: unreadable.Err.Error()}}})
	case err != nil:
		s.internal(w, r, fmt.Errorf("get %s: %w", key, err))
	default:
		s.writeJSON(w, r, http.StatusOK, res)
	}
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, key resource.Key) {
	err := s.store.Delete(r.Context(), key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.writeError(w, r, notFound(key))
	case err != nil:
		s.internal(w, r, fmt.Errorf("delete %s: %w", key, err))
	default:
		s.log.Info("deleted", "resource", key.String())
		s.writeJSON(w, r, http.StatusOK, struct{}{})
	}
}

func (s *Server) put(w http.ResponseWriter, r *http.Request, key resource.Key) {
	ctx := r.Context()
	res, apiErr := decodeResource(w, r)
	if apiErr != nil {
		s.writeError(w, r, apiErr)
		return
	}
	if apiErr := fillFromPath(&res, key); apiErr != nil {
		s.writeError(w, r, apiErr)
		return
	}
	if err := s.reg.Validate(&res); err != nil {
		s.writeError(w, r, fromValidation(err))
		return
	}
	if apiErr := s.fitsKDS(&res); apiErr != nil {
		s.writeError(w, r, apiErr)
		return
	}
	stored, outcome, err := s.write(ctx, res)
	if err != nil {
		s.writeStoreError(w, r, key, res.Generation, err)
		return
	}
	s.log.Info("applied", "resource", key.String(), "result", string(outcome), "generation", stored.Generation)
	w.Header().Set(ResultHeader, string(outcome))
	status := http.StatusOK
	if outcome == Created {
		status = http.StatusCreated
	}
	s.writeJSON(w, r, status, stored)
}

// write stores a validated resource and says whether it created, updated or left it unchanged.
// A Mesh that it creates comes with its default policies, in the same store transaction: all of
// them are stored or none, and of concurrent creates of one Mesh only one writes them. A
// generation that is not zero must be the stored one.
func (s *Server) write(ctx context.Context, res resource.Resource) (resource.Resource, Outcome, error) {
	var onCreate []resource.Resource
	if res.Kind == resource.MeshKind {
		var err error
		if onCreate, err = s.meshDefaults(res.Name); err != nil {
			return resource.Resource{}, "", err
		}
	}
	stored, result, err := s.store.Write(ctx, res, onCreate)
	if err != nil {
		return resource.Resource{}, "", err
	}
	switch result {
	case store.Created:
		return stored, Created, nil
	case store.Updated:
		return stored, Updated, nil
	}
	return stored, Unchanged, nil
}

// BatchRequest is the body of POST /api/apply: resources to create or update, in order.
type BatchRequest struct {
	Items []json.RawMessage `json:"items"`
}

// BatchItem is what POST /api/apply did with one resource: Result (created, updated,
// unchanged), or Error, the answer a PUT of it alone would have got.
type BatchItem struct {
	// Index is the resource's place in the batch, from 0.
	Index int `json:"index"`
	// Key is the resource's kind/name or kind/mesh/name, as far as its document could be read;
	// empty when neither its type nor its name could.
	Key string `json:"key,omitempty"`
	// Status is the status code a PUT of the resource alone would have got: 201 created, 200
	// updated or unchanged, else the error's.
	Status int     `json:"status"`
	Result Outcome `json:"result,omitempty"`
	Error  *Error  `json:"error,omitempty"`
}

// BatchResponse is the answer of POST /api/apply, one item for each resource, in order.
type BatchResponse struct {
	Items   []BatchItem `json:"items"`
	Applied int         `json:"applied"`
	Failed  int         `json:"failed"`
}

// MaxBatch is how many resources one POST /api/apply may carry, and MaxBatchBytes how many bytes
// its body may have (each resource of it at most MaxBodyBytes, as a PUT).
const (
	MaxBatch      = 1000
	MaxBatchBytes = 64 << 20
)

// fitsKDS refuses a resource whose KDS encoding is larger than one KDS response may be.
func (s *Server) fitsKDS(res *resource.Resource) *Error {
	if s.maxWire <= 0 {
		return nil
	}
	e, err := kds.NewEntry(res)
	if err != nil {
		return &Error{Status: http.StatusBadRequest, Title: titleInvalid, Details: fmt.Sprintf("%s cannot be encoded for zones: %v", res.Key(), err)}
	}
	if e.Size > s.maxWire {
		return &Error{Status: http.StatusRequestEntityTooLarge, Title: titleTooLarge,
			Details: fmt.Sprintf("%s: %d bytes encoded for zones; one KDS response is at most %d bytes (--kds-max-message)", res.Key(), e.Size, s.maxWire)}
	}
	return nil
}

// apply serves POST /api/apply: every resource of the batch is decoded and validated as a PUT
// would, and those that pass are written in one store transaction (each on its own: a refused
// one does not stop the others), so a thousand documents make one revision and one snapshot
// update, not a thousand.
func (s *Server) apply(w http.ResponseWriter, r *http.Request) {
	if s.readOnly {
		s.writeError(w, r, &Error{Status: http.StatusMethodNotAllowed, Title: "Read-only", Details: readOnlyDetails})
		return
	}
	var req BatchRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBatchBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			s.writeError(w, r, &Error{Status: http.StatusRequestEntityTooLarge, Title: titleTooLarge,
				Details: fmt.Sprintf("body: larger than %d bytes; split the batch", MaxBatchBytes)})
			return
		}
		s.writeError(w, r, &Error{Status: http.StatusBadRequest, Title: titleInvalid, Details: "the body must be {\"items\": [resource, ...]}: " + err.Error()})
		return
	}
	if len(req.Items) > MaxBatch {
		s.writeError(w, r, &Error{Status: http.StatusRequestEntityTooLarge, Title: titleBatchTooLarge,
			Details: fmt.Sprintf("items: %d resources in one batch; at most %d: split it (kds-host apply does)", len(req.Items), MaxBatch)})
		return
	}
	resp := BatchResponse{Items: make([]BatchItem, len(req.Items))}
	var items []store.WriteItem
	var at []int // items[j] is resp.Items[at[j]]
	for i, doc := range req.Items {
		var res resource.Resource
		var apiErr *Error
		if len(doc) > MaxBodyBytes { // the limit of one resource, as a PUT's body
			apiErr = &Error{Status: http.StatusRequestEntityTooLarge, Title: titleTooLarge,
				Details: fmt.Sprintf("item %d: %d bytes; one resource is at most %d bytes, as a PUT's body", i, len(doc), MaxBodyBytes)}
		} else {
			res, apiErr = DecodeResource(doc)
		}
		if apiErr == nil {
			if _, ok := s.reg.Get(res.Kind); !ok {
				apiErr = fieldError("type", "unknown kind %q (known: %s)", res.Kind, s.reg.KnownNames())
			}
		}
		if apiErr == nil {
			if err := s.reg.Validate(&res); err != nil {
				apiErr = fromValidation(err)
			}
		}
		if apiErr == nil {
			apiErr = s.fitsKDS(&res)
		}
		var onCreate []resource.Resource
		if apiErr == nil && res.Kind == resource.MeshKind {
			var err error
			if onCreate, err = s.meshDefaults(res.Name); err != nil {
				apiErr = &Error{Status: http.StatusInternalServerError, Title: titleInternal, Details: err.Error()}
			}
		}
		if apiErr != nil {
			resp.Items[i] = BatchItem{Index: i, Key: batchKey(doc, res), Status: apiErr.Status, Error: apiErr}
			continue
		}
		resp.Items[i] = BatchItem{Index: i, Key: res.Key().String()}
		items = append(items, store.WriteItem{Resource: res, OnCreate: onCreate})
		at = append(at, i)
	}
	if len(items) > 0 {
		outcomes, err := s.store.WriteBatch(r.Context(), items)
		if err != nil {
			s.internal(w, r, err)
			return
		}
		for j, o := range outcomes {
			i := at[j]
			if o.Err != nil {
				e := s.storeError(items[j].Resource.Key(), items[j].Resource.Generation, o.Err)
				resp.Items[i].Error, resp.Items[i].Status = e, e.Status
				continue
			}
			switch o.Result {
			case store.Created:
				resp.Items[i].Result, resp.Items[i].Status = Created, http.StatusCreated
			case store.Updated:
				resp.Items[i].Result, resp.Items[i].Status = Updated, http.StatusOK
			default:
				resp.Items[i].Result, resp.Items[i].Status = Unchanged, http.StatusOK
			}
		}
	}
	for _, it := range resp.Items {
		if it.Error != nil {
			resp.Failed++
		} else {
			resp.Applied++
		}
	}
	s.log.Info("applied a batch", "resources", len(req.Items), "applied", resp.Applied, "failed", resp.Failed)
	s.writeJSON(w, r, http.StatusOK, resp)
}

// batchKey names a batch item that was refused before it was written: its decoded key, or else
// the type, mesh and name its document holds, as far as they can be read; "" when neither its
// type nor its name can.
func batchKey(doc json.RawMessage, res resource.Resource) string {
	k := res.Key()
	if k.Kind == "" && k.Name == "" {
		var head struct {
			Type string `json:"type"`
			Mesh string `json:"mesh"`
			Name string `json:"name"`
		}
		_ = json.Unmarshal(doc, &head) // fills what it can read
		k = resource.Key{Kind: head.Type, Mesh: head.Mesh, Name: head.Name}
	}
	if k.Kind == "" && k.Name == "" {
		return ""
	}
	return k.String()
}

// meshDefaults returns the validated default policies of a new mesh, leaving out those whose
// kind this API does not serve.
func (s *Server) meshDefaults(mesh string) ([]resource.Resource, error) {
	var out []resource.Resource
	for _, d := range resource.MeshDefaults(mesh) {
		if _, ok := s.reg.Get(d.Kind); !ok {
			continue
		}
		if err := s.reg.Validate(&d); err != nil {
			return nil, fmt.Errorf("mesh %q: default %s: %w", mesh, d.Key(), err)
		}
		out = append(out, d)
	}
	return out, nil
}

// fillFromPath makes the path decide the resource's kind, mesh and name: a body that leaves one
// out gets the path's, a body that contradicts the path is an error naming the field.
func fillFromPath(res *resource.Resource, key resource.Key) *Error {
	for _, f := range []struct {
		field string
		body  *string
		path  string
	}{
		{"type", &res.Kind, key.Kind},
		{"mesh", &res.Mesh, key.Mesh},
		{"name", &res.Name, key.Name},
	} {
		switch {
		case *f.body == "":
			*f.body = f.path
		case *f.body != f.path && f.path == "":
			return fieldError(f.field, "%s is global-scoped: the body must not name a mesh (got %q)", key.Kind, *f.body)
		case *f.body != f.path:
			return fieldError(f.field, "%q contradicts the path, which says %q", *f.body, f.path)
		}
	}
	return nil
}

func notFound(key resource.Key) *Error {
	d := fmt.Sprintf("%s %q not found", key.Kind, key.Name)
	if key.Mesh != "" {
		d += fmt.Sprintf(" in mesh %q", key.Mesh)
	}
	return &Error{Status: http.StatusNotFound, Title: titleNotFound, Details: d}
}

func (s *Server) writeStoreError(w http.ResponseWriter, r *http.Request, key resource.Key, generation int64, err error) {
	s.writeError(w, r, s.storeError(key, generation, err))
}

// storeError is the answer to a write of key that the store refused.
func (s *Server) storeError(key resource.Key, generation int64, err error) *Error {
	var missing *store.MissingOwnerError
	switch {
	case errors.As(err, &missing) && missing.Key == key:
		o := missing.Owner
		field, details := "owners", fmt.Sprintf("owner %s does not exist", o)
		if o.Kind == resource.MeshKind {
			field, details = "mesh", fmt.Sprintf("mesh %q does not exist", o.Name)
		}
		return &Error{Status: http.StatusBadRequest, Title: titleInvalid, Details: details, Causes: []Cause{{Field: field, Message: "does not exist"}}}
	case errors.Is(err, store.ErrConflict):
		return &Error{Status: http.StatusConflict, Title: titleConflict,
			Details: fmt.Sprintf("generation: %d does not match the stored %s: get it again and reapply, or leave generation out", generation, key)}
	}
	if e := s.unavailable(err); e != nil {
		return e
	}
	return &Error{Status: http.StatusInternalServerError, Title: titleInternal, Details: fmt.Sprintf("put %s: %v", key, err)}
}

func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	if e := s.unavailable(err); e != nil {
		s.writeError(w, r, e)
		return
	}
	s.writeError(w, r, &Error{Status: http.StatusInternalServerError, Title: titleInternal, Details: err.Error()})
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *Error) {
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	if e.Status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", e.Status, "error", e.Details)
	} else {
		s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", e.Status, "error", e.Details)
	}
	s.writeJSON(w, r, e.Status, e)
}

func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		return
	}
	if err := WriteJSON(w, status, v); err != nil {
		s.log.Debug("write response", "method", r.Method, "path", r.URL.Path, "error", err)
	}
}

func (s *Server) knownPlurals() string {
	kinds := s.reg.Kinds()
	p := make([]string, 0, len(kinds))
	for _, k := range kinds {
		p = append(p, k.Plural)
	}
	return strings.Join(p, ", ")
}

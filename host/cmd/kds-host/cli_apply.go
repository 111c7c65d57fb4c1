package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
)

func newApplyCmd() *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE|-",
		Short: "Create or update resources from YAML or JSON documents",
		Long: `apply sends every document of the files (YAML separated by "---" lines, or JSON) to the
control plane, each to the route that its type, mesh and name give. A document may also be a list:
{"items": [...]} as "get -o json" prints it, or a JSON array.

Every document is tried; apply fails at the end if any was refused.`,
		Example: `  kds-host apply -f examples/resources/mesh.yaml
  cat policies.yaml | kds-host apply -f -`,
		Args: cobra.NoArgs,
	}
	flags := addAPIFlags(cmd)
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "file to apply, - for standard input (repeatable)")
	_ = cmd.MarkFlagRequired("filename")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := flags.session()
		if err != nil {
			return err
		}
		a := &applier{s: s, cmd: cmd}
		for _, f := range files {
			if err := a.applyFile(f); err != nil {
				return s.explain(err)
			}
		}
		if err := a.flush(); err != nil {
			return s.explain(err)
		}
		switch {
		case a.total == 0:
			return fmt.Errorf("no resources in %s", strings.Join(files, ", "))
		case a.failed > 0:
			return fmt.Errorf("%d of %d documents were not applied", a.failed, a.total)
		}
		return nil
	}
	return cmd
}

// applier applies documents in batches (POST /api/apply, one store transaction a batch), or one
// by one to a control plane that takes no batch, counting those that fail.
type applier struct {
	s             *apiSession
	cmd           *cobra.Command
	total, failed int
	pending       []pendingItem
	pendingBytes  int  // of the pending documents: a batch stays under api.MaxBatchBytes
	noBatch       bool // the control plane has no POST /api/apply
}

// pendingItem is a resource waiting for the next batch, with where it came from.
type pendingItem struct {
	where string
	kind  resource.Kind
	name  string
	doc   json.RawMessage
	err   error // refused before it was sent
}

// applyFile applies every document of one file. It returns an error only when going on makes no
// sense (the file cannot be read, the control plane cannot be reached); a refused document is
// reported and counted.
func (a *applier) applyFile(file string) error {
	var (
		data []byte
		err  error
		name = file
	)
	if file == "-" {
		name = "stdin"
		data, err = io.ReadAll(a.cmd.InOrStdin())
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	for i, doc := range api.SplitDocuments(data) {
		where := fmt.Sprintf("%s:doc#%d", name, i+1)
		items, err := documentItems(doc)
		if err != nil {
			a.pending = append(a.pending, pendingItem{where: where, err: err}) // reported in order
			continue
		}
		for j, item := range items {
			w := where
			if len(items) > 1 {
				w = fmt.Sprintf("%s[%d]", where, j)
			}
			if len(item) > api.MaxBodyBytes { // the API's limit of one resource, said before sending
				a.pending = append(a.pending, pendingItem{where: w, err: fmt.Errorf("%d bytes; one resource is at most %d bytes", len(item), api.MaxBodyBytes)})
				continue
			}
			k, name, err := a.check(item)
			if wholesale(err) {
				return err
			}
			if a.pendingBytes+len(item) > api.MaxBatchBytes/2 { // the batch's JSON stays well under the limit
				if err := a.flush(); err != nil {
					return err
				}
			}
			a.pending = append(a.pending, pendingItem{where: w, kind: k, name: name, doc: item, err: err})
			a.pendingBytes += len(item)
			if len(a.pending) >= api.MaxBatch {
				if err := a.flush(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// flush applies the pending resources: as one batch, or one by one to a control plane that
// takes no batch. A refusal of the whole request (no token, a wrong one) stops everything.
func (a *applier) flush() error {
	all := a.pending
	a.pending, a.pendingBytes = nil, 0
	var items []pendingItem // what is sent
	for _, it := range all {
		if it.err == nil {
			items = append(items, it)
		}
	}
	results := make(map[int]api.BatchItem, len(items)) // by index in items
	if len(items) > 0 && !a.noBatch {
		req := api.BatchRequest{Items: make([]json.RawMessage, len(items))}
		for i, it := range items {
			req.Items[i] = it.doc
		}
		var resp api.BatchResponse
		err := a.s.client.PostJSON(a.cmd.Context(), "/api/apply", req, &resp)
		var ae *api.Error
		switch {
		case errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed):
			a.noBatch = true // an older or read-only control plane: one by one
		case err != nil:
			return err // unreachable, refused as a whole, or failed as a whole
		case len(resp.Items) != len(items):
			return fmt.Errorf("the control plane answered %d results for %d resources", len(resp.Items), len(items))
		default:
			for i, r := range resp.Items {
				results[i] = r
			}
		}
	}
	sent := 0
	for _, it := range all {
		if it.err != nil {
			a.refused(it.where, it.err)
			continue
		}
		i := sent
		sent++
		if r, ok := results[i]; ok {
			if r.Error != nil {
				a.refused(it.where, itemError(r))
				continue
			}
			a.total++
			a.printed(it.kind, it.name, r.Result)
			continue
		}
		if err := a.putOne(it); err != nil {
			return err
		}
	}
	return nil
}

// itemError is a batch item's refusal as the CLI prints it.
func itemError(r api.BatchItem) error {
	r.Error.Status = r.Status
	key := r.Key
	if key == "" {
		key = fmt.Sprintf("item %d of the batch", r.Index)
	}
	return refusal(key, r.Error)
}

// refusal is a resource's refusal as the CLI prints it: its name, the status code when the
// control plane gave one, and the error.
func refusal(name string, err error) error {
	if ae, ok := errors.AsType[*api.Error](err); ok && ae.Status != 0 {
		return fmt.Errorf("%s: %d %w", name, ae.Status, err)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// putOne applies one resource with a PUT, for a control plane that takes no batch. It returns an
// error only when going on makes no sense.
func (a *applier) putOne(it pendingItem) error {
	{
		_, outcome, err := a.s.client.Put(a.cmd.Context(), it.kind, meshOf(it.doc), it.name, it.doc)
		switch {
		case wholesale(err):
			return err
		case err != nil:
			a.refused(it.where, refusal(it.name, err))
			return nil
		}
		a.total++
		a.printed(it.kind, it.name, outcome)
	}
	return nil
}

// wholesale reports whether err stops the whole apply: the control plane cannot be reached, or
// refuses every request alike (no token, one that may not write).
func wholesale(err error) bool {
	var ue *url.Error
	var ae *api.Error
	return errors.As(err, &ue) || errors.As(err, &ae) && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden)
}

// printed reports what the control plane did with one resource.
func (a *applier) printed(k resource.Kind, name string, outcome api.Outcome) {
	verb := "configured"
	switch outcome {
	case api.Created:
		verb = "created"
	case api.Unchanged:
		verb = "unchanged"
	}
	fmt.Fprintf(a.cmd.OutOrStdout(), "%s %s\n", display(k, name), verb)
}

// meshOf is a resource document's mesh.
func meshOf(doc json.RawMessage) string {
	var head struct {
		Mesh string `json:"mesh"`
	}
	_ = json.Unmarshal(doc, &head)
	return head.Mesh
}

// refused reports a document that was not applied.
func (a *applier) refused(where string, err error) {
	a.total++
	a.failed++
	fmt.Fprintf(a.cmd.ErrOrStderr(), "error: %s: %v\n", where, err)
}

// check reads what a resource document is (its kind and name), and what is wrong with it that
// the control plane would refuse anyway.
func (a *applier) check(doc json.RawMessage) (resource.Kind, string, error) {
	var head struct {
		Type string `json:"type"`
		Mesh string `json:"mesh"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(doc, &head); err != nil {
		return resource.Kind{}, "", fmt.Errorf("not a resource: %w", err)
	}
	reg, err := a.s.registry(a.cmd.Context())
	if err != nil {
		return resource.Kind{}, "", err
	}
	id := head.Type + "/" + head.Name
	switch {
	case head.Type == "":
		return resource.Kind{}, "", fmt.Errorf("type: is required (one of %s)", reg.KnownNames())
	case head.Name == "":
		return resource.Kind{}, "", fmt.Errorf("%s: name: is required", head.Type)
	}
	k, ok := reg.Get(head.Type)
	if !ok {
		return resource.Kind{}, "", fmt.Errorf("%s: type: unknown kind %q (known: %s)", id, head.Type, reg.KnownNames())
	}
	if k.Scope == resource.ScopeMesh && head.Mesh == "" {
		return resource.Kind{}, "", fmt.Errorf("%s: mesh: is required for %s", id, k.Name)
	}
	return k, head.Name, nil
}

// documentItems decodes one document into the resources it holds: itself, or the elements of a
// JSON array or of a list's "items". A document may also be a stream of JSON values.
func documentItems(doc []byte) ([]json.RawMessage, error) {
	values, err := jsonStream(doc)
	if err != nil {
		j, yerr := api.DocumentJSON(doc)
		switch {
		case errors.Is(yerr, api.ErrExpandsTooLarge) || errors.Is(yerr, api.ErrNestsTooDeep):
			return nil, yerr
		case yerr != nil:
			return nil, fmt.Errorf("not valid YAML or JSON: %w", yerr)
		}
		values = []json.RawMessage{j}
	}
	var items []json.RawMessage
	for _, v := range values {
		v = bytes.TrimSpace(v)
		switch {
		case len(v) > 0 && v[0] == '[':
			var list []json.RawMessage
			if err := json.Unmarshal(v, &list); err != nil {
				return nil, err
			}
			items = append(items, list...)
		case len(v) > 0 && v[0] == '{':
			var list struct {
				Type  *string            `json:"type"`
				Items *[]json.RawMessage `json:"items"`
			}
			if err := json.Unmarshal(v, &list); err == nil && list.Type == nil && list.Items != nil {
				items = append(items, *list.Items...)
				continue
			}
			items = append(items, v)
		default:
			return nil, fmt.Errorf("not a resource: want an object, got %s", v)
		}
	}
	return items, nil
}

// jsonStream decodes a document of one or more concatenated JSON values.
func jsonStream(doc []byte) ([]json.RawMessage, error) {
	doc = bytes.TrimSpace(doc)
	if len(doc) == 0 || (doc[0] != '{' && doc[0] != '[') {
		return nil, errors.New("not JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	var out []json.RawMessage
	for {
		var v json.RawMessage
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
}

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
		Example: `  kds-host apply -f examples/mesh.yaml
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

// applier applies documents one by one, counting those that fail.
type applier struct {
	s             *apiSession
	cmd           *cobra.Command
	total, failed int
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
			a.refused(where, err)
			continue
		}
		for j, item := range items {
			w := where
			if len(items) > 1 {
				w = fmt.Sprintf("%s[%d]", where, j)
			}
			err := a.applyItem(item)
			var ue *url.Error
			var ae *api.Error
			switch {
			case errors.As(err, &ue):
				return err
			case errors.As(err, &ae) && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden):
				return ae // every other document would be refused the same way
			case err != nil:
				a.refused(w, err)
			default:
				a.total++
			}
		}
	}
	return nil
}

// refused reports a document that was not applied.
func (a *applier) refused(where string, err error) {
	a.total++
	a.failed++
	fmt.Fprintf(a.cmd.ErrOrStderr(), "error: %s: %v\n", where, err)
}

// applyItem sends one resource (JSON) to its route and prints what the control plane did.
func (a *applier) applyItem(doc json.RawMessage) error {
	var head struct {
		Type string `json:"type"`
		Mesh string `json:"mesh"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(doc, &head); err != nil {
		return fmt.Errorf("not a resource: %w", err)
	}
	ctx := a.cmd.Context()
	reg, err := a.s.registry(ctx)
	if err != nil {
		return err
	}
	id := head.Type + "/" + head.Name
	switch {
	case head.Type == "":
		return fmt.Errorf("type: is required (one of %s)", reg.KnownNames())
	case head.Name == "":
		return fmt.Errorf("%s: name: is required", head.Type)
	}
	k, ok := reg.Get(head.Type)
	if !ok {
		return fmt.Errorf("%s: type: unknown kind %q (known: %s)", id, head.Type, reg.KnownNames())
	}
	if k.Scope == resource.ScopeMesh && head.Mesh == "" {
		return fmt.Errorf("%s: mesh: is required for %s", id, k.Name)
	}
	if k.Scope == resource.ScopeMesh {
		id = head.Type + "/" + head.Mesh + "/" + head.Name
	}
	_, outcome, err := a.s.client.Put(ctx, k, head.Mesh, head.Name, doc)
	if err != nil {
		return fmt.Errorf("%s: %w", id, err)
	}
	verb := "configured"
	switch outcome {
	case api.Created:
		verb = "created"
	case api.Unchanged:
		verb = "unchanged"
	}
	fmt.Fprintf(a.cmd.OutOrStdout(), "%s %s\n", display(k, head.Name), verb)
	return nil
}

// documentItems decodes one document into the resources it holds: itself, or the elements of a
// JSON array or of a list's "items". A document may also be a stream of JSON values.
func documentItems(doc []byte) ([]json.RawMessage, error) {
	values, err := jsonStream(doc)
	if err != nil {
		j, yerr := api.DocumentJSON(doc)
		if yerr != nil {
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

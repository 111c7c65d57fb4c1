package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	yamlv2 "go.yaml.in/yaml/v2"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/resource"
)

// defaultMesh is the mesh of the -m flag when it is not given.
const defaultMesh = "default"

func newGetCmd() *cobra.Command {
	var (
		mesh      string
		allMeshes bool
		output    string
	)
	cmd := &cobra.Command{
		Use:   "get KIND [NAME]",
		Short: "Show one resource, or list the resources of a kind",
		Long: `get shows a resource, or without NAME lists a kind's resources: those of one mesh (-m) for a
mesh-scoped kind, or of every mesh with -A. KIND is singular or plural, in any case:
meshtimeout, meshtimeouts and MeshTimeout name the same kind.`,
		Example: `  kds-host get meshes
  kds-host get meshtimeouts -m default -o yaml
  kds-host get MeshTimeout mesh-timeout-all-default -o json`,
		Args: cobra.RangeArgs(1, 2),
	}
	flags := addAPIFlags(cmd)
	cmd.Flags().StringVarP(&mesh, "mesh", "m", defaultMesh, "mesh of a mesh-scoped kind")
	cmd.Flags().BoolVarP(&allMeshes, "all-meshes", "A", false, "list a mesh-scoped kind in every mesh")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, wide (the table with labels, owners and the last change), yaml or json")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		switch output {
		case "table", "wide", "yaml", "json":
		default:
			return fmt.Errorf("--output %q: want table, wide, yaml or json", output)
		}
		if allMeshes && len(args) == 2 {
			return fmt.Errorf("--all-meshes lists: it takes no NAME")
		}
		s, err := flags.session()
		if err != nil {
			return err
		}
		return s.explain(runGet(cmd, s, args, mesh, allMeshes, output))
	}
	return cmd
}

func runGet(cmd *cobra.Command, s *apiSession, args []string, mesh string, allMeshes bool, output string) error {
	ctx := cmd.Context()
	k, err := s.kind(ctx, args[0])
	if err != nil {
		return err
	}
	if k.Scope == resource.ScopeGlobal || allMeshes {
		mesh = ""
	}
	out := cmd.OutOrStdout()
	if len(args) == 2 {
		r, err := s.client.Get(ctx, k, mesh, args[1])
		if err != nil {
			return err
		}
		if output == "table" || output == "wide" {
			return printTable(out, k, []resource.Resource{r}, output == "wide", time.Now())
		}
		return printDocument(out, output, r)
	}
	list, err := s.client.List(ctx, k, mesh)
	if err != nil {
		return err
	}
	warnUnreadable(cmd.ErrOrStderr(), k, list.Unreadable)
	if output != "table" && output != "wide" {
		return printDocument(out, output, list)
	}
	if list.Total == 0 {
		where := ""
		switch {
		case k.Scope == resource.ScopeMesh && mesh == "":
			where = " in any mesh"
		case k.Scope == resource.ScopeMesh:
			where = fmt.Sprintf(" in mesh %q", mesh)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "No %s found%s.\n", k.Plural, where)
		return nil
	}
	return printTable(out, k, list.Items, output == "wide", time.Now())
}

// warnUnreadable names the stored rows the list left out because the store cannot read them.
func warnUnreadable(w io.Writer, k resource.Kind, rows []api.UnreadableRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "Warning: stored but not listed, the store cannot read them (apply each again, or delete it):")
	for _, r := range rows {
		name := r.Name
		if r.Mesh != "" {
			name = r.Mesh + "/" + r.Name
		}
		fmt.Fprintf(w, "  %s %s: stored %s: %s\n", k.Name, name, r.Column, r.Error)
	}
}

func newDeleteCmd() *cobra.Command {
	var mesh string
	cmd := &cobra.Command{
		Use:     "delete KIND NAME",
		Short:   "Delete a resource (deleting a Mesh deletes its policies)",
		Example: "  kds-host delete meshtimeout my-timeout -m default",
		Args:    cobra.ExactArgs(2),
	}
	flags := addAPIFlags(cmd)
	cmd.Flags().StringVarP(&mesh, "mesh", "m", defaultMesh, "mesh of a mesh-scoped kind")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		s, err := flags.session()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		k, err := s.kind(ctx, args[0])
		if err != nil {
			return s.explain(err)
		}
		if k.Scope == resource.ScopeGlobal {
			mesh = ""
		}
		if err := s.client.Delete(ctx, k, mesh, args[1]); err != nil {
			return s.explain(err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s deleted\n", display(k, args[1]))
		return nil
	}
	return cmd
}

// printTable prints resources as columns: MESH (for a mesh-scoped kind), NAME, GENERATION, AGE,
// and when wide, LABELS, OWNERS and MODIFIED (how long since the last change).
func printTable(w io.Writer, k resource.Kind, items []resource.Resource, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	var head []string
	if k.Scope == resource.ScopeMesh {
		head = append(head, "MESH")
	}
	head = append(head, "NAME", "GENERATION", "AGE")
	if wide {
		head = append(head, "LABELS", "OWNERS", "MODIFIED")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range items {
		var row []string
		if k.Scope == resource.ScopeMesh {
			row = append(row, r.Mesh)
		}
		row = append(row, r.Name, strconv.FormatInt(r.Generation, 10), age(r.CreationTime, now))
		if wide {
			labels := make([]string, 0, len(r.Labels))
			for _, l := range slices.Sorted(maps.Keys(r.Labels)) {
				labels = append(labels, l+"="+r.Labels[l])
			}
			owners := make([]string, 0, len(r.Owners))
			for _, o := range r.Owners {
				owners = append(owners, o.String())
			}
			row = append(row, dash(strings.Join(labels, ",")), dash(strings.Join(owners, ",")), age(r.ModificationTime, now))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// age is how long ago t was, as kubectl and kumactl print it (45s, 12m, 3h, 5d), or "-" when the
// store did not say.
func age(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// printDocument prints v (a resource or an api.List) as indented JSON, or as YAML whose keys
// keep the order of the JSON (type, mesh, name, ... as the API writes them).
func printDocument(w io.Writer, format string, v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if format == "json" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, j, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	y, err := orderedYAML(dec)
	if err != nil {
		return err
	}
	b, err := yamlv2.Marshal(y)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// orderedYAML reads the next JSON value of dec as a YAML value whose objects keep their keys'
// order.
func orderedYAML(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := yamlv2.MapSlice{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := orderedYAML(dec)
				if err != nil {
					return nil, err
				}
				obj = append(obj, yamlv2.MapItem{Key: kt, Value: v})
			}
			_, err := dec.Token() // '}'
			return obj, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := orderedYAML(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token() // ']'
			return list, err
		}
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		return f, err
	}
	return tok, nil
}

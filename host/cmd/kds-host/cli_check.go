package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/controlplane"
)

// errRejected makes `check` exit 1 when a resource would be rejected.
var errRejected = errors.New("a resource would be rejected")

func newCheckCmd() *cobra.Command {
	var (
		file   string
		zone   string
		output string
	)
	cmd := &cobra.Command{
		Use:   "check -f FILE [--zone ZONE]",
		Short: "Predict, for each resource in FILE, whether the global would send it to a zone, withhold it until its owner is there, or reject it",
		Long: `check asks the global's owner check what it would decide for each resource in FILE: ACCEPT
(sent at once), WAIT (withheld until the zone has ACKed its owner) or REJECT (the owner exists
nowhere). --zone judges against what that zone has ACKed now; without it, against a zone that
has ACKed nothing.
It exits 1 when any resource would be rejected, so it can gate a CI pipeline.`,
		Example: `  kds-host check -f examples/resources/meshtimeout.yaml --zone zone-1`,
		Args:    cobra.NoArgs,
	}
	flags := addAPIFlags(cmd)
	cmd.Flags().StringVarP(&file, "filename", "f", "", "file of YAML or JSON documents, or - for standard input")
	cmd.Flags().StringVar(&zone, "zone", "", "judge against this zone's inventory (default: an empty zone)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if file == "" {
			return fmt.Errorf("-f FILE is required")
		}
		if output != "table" && output != "json" {
			return fmt.Errorf("--output %q: want table or json", output)
		}
		s, err := flags.session()
		if err != nil {
			return err
		}
		req, err := readCheckRequest(cmd.InOrStdin(), file)
		if err != nil {
			return err
		}
		req.Zone = zone
		var res controlplane.CheckResult
		if err := s.client.PostJSON(cmd.Context(), "/api/check", req, &res); err != nil {
			return s.explain(fmt.Errorf("check: %w", err))
		}
		for _, w := range res.Warnings {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
		}
		out := cmd.OutOrStdout()
		if output == "json" {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			if err := enc.Encode(res); err != nil {
				return err
			}
		} else {
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RESOURCE\tVERDICT\tWAITING FOR\tREASON")
			for _, it := range res.Items {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", it.Key, it.Verdict, dash(it.WaitingFor), dash(it.Reason))
			}
			tw.Flush()
		}
		if res.Rejected > 0 {
			cmd.SilenceErrors = true
			fmt.Fprintf(cmd.ErrOrStderr(), "%d of %d resources would be rejected\n", res.Rejected, len(res.Items))
			return errRejected
		}
		return nil
	}
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// readCheckRequest reads every resource document of file ("-" is stdin).
func readCheckRequest(stdin io.Reader, file string) (controlplane.CheckRequest, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return controlplane.CheckRequest{}, fmt.Errorf("read %s: %w", file, err)
	}
	var req controlplane.CheckRequest
	for i, doc := range api.SplitDocuments(data) {
		items, err := documentItems(doc)
		if err != nil {
			return req, fmt.Errorf("%s:doc#%d: %w", file, i+1, err)
		}
		for _, item := range items {
			r, apiErr := api.DecodeResource(item)
			if apiErr != nil {
				return req, fmt.Errorf("%s:doc#%d: %s", file, i+1, apiErr.Error())
			}
			req.Resources = append(req.Resources, r)
		}
	}
	if len(req.Resources) == 0 {
		return req, fmt.Errorf("%s holds no resource", file)
	}
	return req, nil
}

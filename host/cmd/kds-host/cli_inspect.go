package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/policy"
)

// newInspectCmd is `kds-host inspect`: views of a running global's state, one subcommand each.
func newInspectCmd() *cobra.Command {
	return groupCmd("inspect", "Show what a running global knows: its zones, its plugins",
		newInspectZonesCmd(), newInspectPluginsCmd())
}

// groupCmd is a command that only groups its subcommands.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
	cmd.AddCommand(subs...)
	return cmd
}

// inspectCmd makes cmd an `inspect` view: it asks the global (--cp) for path, and prints the
// answer, a T, as JSON (-o json) or with table (-o table, the default).
func inspectCmd[T any](cmd *cobra.Command, path string, table func(cmd *cobra.Command, v T) error) *cobra.Command {
	cmd.Args = cobra.NoArgs
	flags := addAPIFlags(cmd)
	var output string
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if output != "table" && output != "json" {
			return fmt.Errorf("--output %q: want table or json", output)
		}
		s, err := flags.session()
		if err != nil {
			return err
		}
		var v T
		if err := s.client.GetJSON(cmd.Context(), path, &v); err != nil {
			return s.explain(fmt.Errorf("inspect %s: %w", cmd.Name(), err))
		}
		if output == "json" {
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(v)
		}
		return table(cmd, v)
	}
	return cmd
}

func newInspectPluginsCmd() *cobra.Command {
	return inspectCmd(&cobra.Command{
		Use:   "plugins",
		Short: "Show the global's plugins: path, checksum, version, pid, state, restarts, calls and latency",
		Long: `plugins asks the global (--cp) for its plugins: each binary with the services it serves, its
checksum and version, the process id, its state (running, restarting), how often it was restarted,
its calls, errors and timeouts, and the p50 and p99 latency of its latest calls; then builtin, the
in-process policies that serve what no plugin serves and answer when a plugin cannot. Under the
table, each plugin's last error: a failed call (a decision outside the host's bounds, such as a
delay over --retry-max-delay, counts as one), or why it went out of service.`,
		Example: `  kds-host inspect plugins
  kds-host inspect plugins -o json`,
	}, "/api/plugins", func(cmd *cobra.Command, r controlplane.PluginsReport) error {
		return printPlugins(cmd.OutOrStdout(), r)
	})
}

// printPlugins prints a plugins report as a table, and the latest reload under it.
func printPlugins(w io.Writer, r controlplane.PluginsReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPATH\tCHECKSUM\tVERSION\tSERVES\tPID\tSTATE\tRESTARTS\tCALLS\tERRORS\tTIMEOUTS\tP50\tP99\tPOLICY")
	for _, p := range r.Items {
		serves := strings.Join(p.Serves, ",")
		if len(p.FallbackFor) > 0 {
			serves = strings.TrimPrefix(serves+",fallback:"+strings.Join(p.FallbackFor, ","), ",")
		}
		pid := "-"
		if p.PID != 0 {
			pid = strconv.Itoa(p.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n",
			p.Name, p.Path, shortChecksum(p.Checksum), dash(p.Version), dash(serves), pid, p.State,
			p.Restarts, p.Calls, p.Errors, p.Timeouts, latency(p.Latency.P50, p.Calls), latency(p.Latency.P99, p.Calls), dash(p.Policy))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range r.Items {
		if p.LastError != "" && p.State != policy.StateBuiltin {
			at := ""
			if p.LastErrorAt != nil {
				at = " (" + p.LastErrorAt.Local().Format(time.DateTime) + ")"
			}
			fmt.Fprintf(w, "%s: last error%s: %s\n", p.Name, at, p.LastError)
		}
	}
	if lr := r.LastReload; lr != nil {
		outcome := "ok"
		if lr.Error != "" {
			outcome = "failed, the running plugins stayed: " + lr.Error
		}
		fmt.Fprintf(w, "Last reload: %s, %s\n", lr.At.Local().Format(time.DateTime), outcome)
	}
	return nil
}

// shortChecksum is sha256: and the first 12 hex digits, as in a table cell.
func shortChecksum(c string) string {
	const keep = len("sha256:") + 12
	if len(c) > keep {
		return c[:keep]
	}
	return dash(c)
}

func latency(d policy.Duration, calls uint64) string {
	if calls == 0 {
		return "-"
	}
	return time.Duration(d).Round(time.Microsecond).String()
}

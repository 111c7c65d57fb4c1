// Command kds-host runs a kds-host control plane (global or zone) and talks to one: apply, get,
// delete, inspect, check, plugin verify.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRootCmd().Execute(); err != nil {
		if !errors.Is(err, errRejected) {
			fmt.Fprintln(os.Stderr, "Error:", err)
		}
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "kds-host",
		Short: "A multizone control plane that syncs resources from a global to zones over delta xDS",
		Long: `kds-host runs a control plane: --mode global (the default) stores resources and serves
them to zones over delta xDS (KDS); --mode zone connects to a global and applies what it is sent
to its own database, NACKing what that database refuses.

Every flag has an environment twin: KDS_ and the flag in upper snake case
(--zone-name -> KDS_ZONE_NAME). A flag given on the command line wins.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return bindEnv(cmd)
		},
	}
	root.RunE = addRunFlags(root).run
	root.AddCommand(newVersionCmd())
	root.AddCommand(clientCommands()...)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of kds-host",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			goVersion := "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
			}
			fmt.Fprintf(cmd.OutOrStdout(), "kds-host %s (%s)\n", version, goVersion)
		},
	}
}

// EnvName is the environment twin of a flag: KDS_ and the flag in upper snake case.
func EnvName(flag string) string {
	return "KDS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindEnv sets every flag of cmd (local and inherited) that the command line left alone from its
// environment twin. A bad value is an error that names both.
func bindEnv(cmd *cobra.Command) error {
	var err error
	visit := func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		v, ok := os.LookupEnv(EnvName(f.Name))
		if !ok {
			return
		}
		if sv, isSlice := f.Value.(pflag.SliceValue); isSlice {
			if e := sv.Replace(strings.Split(v, ",")); e != nil {
				err = fmt.Errorf("%s=%q (--%s): %w", EnvName(f.Name), v, f.Name, e)
			}
			return
		}
		if e := f.Value.Set(v); e != nil {
			err = fmt.Errorf("%s=%q (--%s): %w", EnvName(f.Name), v, f.Name, e)
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return err
}

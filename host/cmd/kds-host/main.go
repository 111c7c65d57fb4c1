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
(--zone-name -> KDS_ZONE_NAME), read only in the mode the flag is for; a client command's flags
read KDS_CLI_ and the flag (--filename -> KDS_CLI_FILENAME), --cp also KDS_CP, and the API token
is KDS_TOKEN. A flag given on the command line wins.`,
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

// EnvName is the environment twin of a control plane's flag: KDS_ and the flag in upper snake
// case.
func EnvName(flag string) string { return envPrefix + snake(flag) }

// CLIEnvName is the environment twin of a client command's flag: KDS_CLI_ and the flag in upper
// snake case. (--cp also reads KDS_CP, and the API token KDS_TOKEN.)
func CLIEnvName(flag string) string { return cliEnvPrefix + snake(flag) }

const (
	envPrefix    = "KDS_"
	cliEnvPrefix = "KDS_CLI_"
)

func snake(flag string) string { return strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }

// flagScope is the mode a control plane's flag applies to, as its help text says ("global: ...",
// "zone, fault injection: ..."), or "" when it applies to both.
func flagScope(f *pflag.Flag) string {
	for _, m := range []string{"global", "zone"} {
		if strings.HasPrefix(f.Usage, m+":") || strings.HasPrefix(f.Usage, m+",") {
			return m
		}
	}
	return ""
}

// bindEnv sets every flag of cmd (local and inherited) that the command line left alone from its
// environment twin, as if given: a required flag is satisfied by its twin. A control plane's
// flag of one mode reads its twin only in that mode, so KDS_ZONE_NAME set for a zone does not
// reach a global started from the same shell; a client command's flags read KDS_CLI_*, so that
// they never take a control plane's variable. A bad value is an error that names both.
func bindEnv(cmd *cobra.Command) error {
	client := cmd != cmd.Root()
	mode := ""
	if !client {
		if m := cmd.Flags().Lookup("mode"); m != nil {
			if v, ok := os.LookupEnv(EnvName("mode")); ok && !m.Changed {
				if err := cmd.Flags().Set("mode", v); err != nil {
					return fmt.Errorf("%s=%q (--mode): %w", EnvName("mode"), v, err)
				}
			}
			mode = m.Value.String()
		}
	}
	var err error
	visit := func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := EnvName(f.Name)
		if client {
			name = CLIEnvName(f.Name)
		} else if scope := flagScope(f); scope != "" && scope != mode {
			return // another mode's flag
		}
		v, ok := os.LookupEnv(name)
		if !ok && client && f.Name == "cp" {
			name = envPrefix + "CP"
			v, ok = os.LookupEnv(name)
		}
		if !ok {
			return
		}
		if sv, isSlice := f.Value.(pflag.SliceValue); isSlice {
			if e := sv.Replace(strings.Split(v, ",")); e != nil {
				err = fmt.Errorf("%s=%q (--%s): %w", name, v, f.Name, e)
			}
			f.Changed = true
			return
		}
		if e := f.Value.Set(v); e != nil {
			err = fmt.Errorf("%s=%q (--%s): %w", name, v, f.Name, e)
			return
		}
		f.Changed = true
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return err
}

package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/conformance"
	"github.com/kds-host/kds-host/shared/launch"
)

func newPluginCmd() *cobra.Command {
	return groupCmd("plugin", "Work with kds-host plugin binaries", newPluginVerifyCmd(), newPluginChecksumCmd())
}

func newPluginChecksumCmd() *cobra.Command {
	var folder bool
	cmd := &cobra.Command{
		Use:   "checksum PATH",
		Short: "Print the --plugin value that pins a plugin's checksum",
		Long: `checksum prints PATH@sha256:HEX, the --plugin value that pins the file at PATH: the host then
runs exactly the bytes that were hashed, from a private copy. A script plugin loads more than
its own file (its modules, its .proto files, node_modules) and a pin of the file alone does not
cover those, nor can the copy find them: --folder prints PATH@sha256-folder:HEX, which pins
every file of the folder PATH is in, at any depth (the folder of what PATH resolves to, when it
is a symbolic link), and the host copies and runs the whole folder. The folder's checksum is
also what this prints there:

  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum

(symbolic links are neither hashed nor copied). docs/plugin-protocol.md, Compatibility, says more.`,
		Example: `  kds-host --plugin "$(kds-host plugin checksum ./bin/retry-forcer)"
  kds-host --plugin "$(kds-host plugin checksum --folder ./my-plugin/plugin.py)"`,
		Args: cobra.ExactArgs(1),
	}
	cmd.Flags().BoolVar(&folder, "folder", false, "pin the folder PATH is in, every file of it, not PATH alone")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		var sum, sep string
		var err error
		if folder {
			sum, err = launch.FolderChecksum(args[0])
			sep = "@sha256-folder:"
		} else {
			sum, err = launch.FileSHA256(args[0])
			sep = "@sha256:"
		}
		if err != nil {
			return fmt.Errorf("plugin checksum: %w", err)
		}
		_, err = fmt.Fprintln(cmd.OutOrStdout(), args[0]+sep+sum)
		return err
	}
	return cmd
}

func newPluginVerifyCmd() *cobra.Command {
	var (
		configFile, giveUpFile string
		callTimeout            time.Duration
		retryMaxDelay          time.Duration
		verbose                bool
	)
	cmd := &cobra.Command{
		Use:   "verify PATH",
		Short: "Check that a binary is a correct kds-host plugin",
		Long: `verify starts the plugin binary at PATH the way the control plane does (go-plugin over gRPC,
the kds-host handshake) and runs the conformance suite against it: handshake and version
negotiation, Describe, Configure, schedule bounds and give-up for a RetryForcer, the verdict
table for an OwnerCheck, empty, bad and large inputs, concurrent calls, latency, and a clean exit
after Kill. It prints each check, passed or failed and why, and exits 0 only when none failed.

A RetryForcer runs under its own sample_config unless --config names a policy document. The
give-up check sets maxAttempts: 3 in that document; a plugin that spells its limit differently
takes a document that makes it give up from --give-up-config. Its answers are held to the
bounds of a host run with the same --retry-max-delay (1h by default). One fault fails one
check: the checks after it are marked not run. docs/plugin-protocol.md is the contract.`,
		Example: `  kds-host plugin verify ./bin/retry-forcer
  kds-host plugin verify ./my-retry --config policy.yaml --give-up-config give-up.yaml`,
		Args: cobra.ExactArgs(1),
	}
	cmd.Flags().StringVar(&configFile, "config", "", "a RetryForcer policy document to run the checks under (default: the plugin's sample_config)")
	cmd.Flags().StringVar(&giveUpFile, "give-up-config", "", "a RetryForcer policy document that makes the plugin give up after a few rounds")
	cmd.Flags().DurationVar(&callTimeout, "call-timeout", 2*time.Second, "deadline of each call to the plugin")
	cmd.Flags().DurationVar(&retryMaxDelay, "retry-max-delay", shared.DefaultMaxDelay, "the host's --retry-max-delay: the longest delay the host you run accepts")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "show go-plugin's and the plugin's log on stderr")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		opts := conformance.Options{Path: args[0], CallTimeout: callTimeout, Bounds: shared.Bounds{MaxDelay: retryMaxDelay}}
		var err error
		if opts.Config, err = readOptional("--config", configFile); err != nil {
			return err
		}
		if opts.GiveUpConfig, err = readOptional("--give-up-config", giveUpFile); err != nil {
			return err
		}
		if verbose {
			opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Debug, Output: cmd.ErrOrStderr()})
		}
		// Ctrl-C ends the run early; the suite still kills the plugin before it returns.
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		report := conformance.Run(ctx, opts)
		if err := report.Write(cmd.OutOrStdout()); err != nil {
			return err
		}
		return report.Err()
	}
	return cmd
}

// readOptional reads the file a flag names, if it names one.
func readOptional(flag, path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return b, nil
}

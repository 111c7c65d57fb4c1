package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/kds-host/kds-host/host/auth"
)

// cliConfig is the CLI's own file of named control planes, as kumactl keeps them: under the
// user's config dir (kds-host/config.yaml, mode 0600: it may hold tokens).
type cliConfig struct {
	Current       string         `json:"current,omitempty"`
	ControlPlanes []controlPlane `json:"controlPlanes,omitempty"`
}

// controlPlane is one named control plane: its API's address and how to authenticate to it.
type controlPlane struct {
	Name      string `json:"name"`
	Address   string `json:"address"`
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
	CAFile    string `json:"caFile,omitempty"`
}

// cliConfigPath is where the CLI keeps its config: $XDG_CONFIG_HOME/kds-host/config.yaml (or the
// platform's user config dir).
func cliConfigPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("find the user's config dir: %w", err)
	}
	return filepath.Join(dir, "kds-host", "config.yaml"), nil
}

func loadCLIConfig() (cliConfig, string, error) {
	var c cliConfig
	path, err := cliConfigPath()
	if err != nil {
		return c, "", err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, path, nil
	}
	if err != nil {
		return c, path, err
	}
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return c, path, fmt.Errorf("%s: %w", path, err)
	}
	return c, path, nil
}

func (c cliConfig) save(path string) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	return auth.WriteFileAtomic(path, b, 0o600)
}

// current is the control plane in use, if one is set.
func (c cliConfig) current() (controlPlane, bool) {
	for _, cp := range c.ControlPlanes {
		if cp.Name == c.Current {
			return cp, true
		}
	}
	return controlPlane{}, false
}

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Keep named control planes for the CLI, as kumactl does",
		Long: `config keeps named control planes (the API's address, a token or token file, a CA file) in
the user's config dir (kds-host/config.yaml, mode 0600). The current one is what every client
command talks to when --cp is not given (and KDS_CP / KDS_CLI_CP are not set).`,
	}
	cps := &cobra.Command{Use: "control-planes", Short: "Add, switch, list and remove named control planes"}
	cmd.AddCommand(cps)

	var add controlPlane
	var overwrite bool
	addCmd := &cobra.Command{
		Use:   "add --name NAME --address URL",
		Short: "Add a control plane and switch to it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if add.Name == "" || add.Address == "" {
				return fmt.Errorf("--name and --address are required")
			}
			if (&apiFlags{cp: add.Address, timeout: 1}).checkAddress() != nil {
				return fmt.Errorf("--address %q: want an http:// or https:// URL, e.g. %s", add.Address, defaultCP)
			}
			c, path, err := loadCLIConfig()
			if err != nil {
				return err
			}
			i := slices.IndexFunc(c.ControlPlanes, func(cp controlPlane) bool { return cp.Name == add.Name })
			switch {
			case i >= 0 && !overwrite:
				return fmt.Errorf("a control plane %q exists already (give --overwrite to replace it)", add.Name)
			case i >= 0:
				c.ControlPlanes[i] = add
			default:
				c.ControlPlanes = append(c.ControlPlanes, add)
			}
			c.Current = add.Name
			if err := c.save(path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added control plane %q (%s), and switched to it\n", add.Name, add.Address)
			return nil
		},
	}
	addCmd.Flags().StringVar(&add.Name, "name", "", "a name for the control plane (required)")
	addCmd.Flags().StringVar(&add.Address, "address", "", "its API address, e.g. https://global.example:5681 (required)")
	addCmd.Flags().StringVar(&add.Token, "token", "", "its API token (kept in the config file, mode 0600)")
	addCmd.Flags().StringVar(&add.TokenFile, "token-file", "", "a file holding its API token, read at each command")
	addCmd.Flags().StringVar(&add.CAFile, "ca-file", "", "the CA that signed its API certificate, for https://")
	addCmd.Flags().BoolVar(&overwrite, "overwrite", false, "replace a control plane of the same name")

	var name string
	switchCmd := &cobra.Command{
		Use:   "switch --name NAME",
		Short: "Make a control plane the current one",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, path, err := loadCLIConfig()
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(c.ControlPlanes, func(cp controlPlane) bool { return cp.Name == name }) {
				return fmt.Errorf("no control plane %q (see kds-host config control-planes list)", name)
			}
			c.Current = name
			if err := c.save(path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "switched to control plane %q\n", name)
			return nil
		},
	}
	switchCmd.Flags().StringVar(&name, "name", "", "the control plane's name")

	var removeName string
	removeCmd := &cobra.Command{
		Use:   "remove --name NAME",
		Short: "Forget a control plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, path, err := loadCLIConfig()
			if err != nil {
				return err
			}
			i := slices.IndexFunc(c.ControlPlanes, func(cp controlPlane) bool { return cp.Name == removeName })
			if i < 0 {
				return fmt.Errorf("no control plane %q", removeName)
			}
			c.ControlPlanes = slices.Delete(c.ControlPlanes, i, i+1)
			if c.Current == removeName {
				c.Current = ""
			}
			if err := c.save(path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed control plane %q\n", removeName)
			return nil
		},
	}
	removeCmd.Flags().StringVar(&removeName, "name", "", "the control plane's name")

	listCmd := &cobra.Command{
		Use:   "list",
		Short: "List the control planes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := loadCLIConfig()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ACTIVE\tNAME\tADDRESS")
			for _, cp := range c.ControlPlanes {
				active := ""
				if cp.Name == c.Current {
					active = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", active, cp.Name, cp.Address)
			}
			return tw.Flush()
		},
	}
	cps.AddCommand(addCmd, switchCmd, listCmd, removeCmd)
	return cmd
}

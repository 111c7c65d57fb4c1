package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Mint zone and user tokens (on the global's API, with an admin token)",
		Long: `token asks the global (--cp) to sign a token:

  kds-host token zone --name zone-1 > zone-1.token     # for kds-host --mode zone --zone-token-file zone-1.token
  kds-host token user --name alice --group read-only   # for the API: --token-file, or KDS_TOKEN

A zone token lets a zone open its KDS stream under that name, and no other; a user token of the
read-only group may read, one of the admin group may do everything.`,
	}
	cmd.AddCommand(newTokenKindCmd(auth.KindZone), newTokenKindCmd(auth.KindUser))
	return cmd
}

func newTokenKindCmd(kind string) *cobra.Command {
	var name, validFor string
	var groups []string
	cmd := &cobra.Command{
		Use:   kind + " --name NAME",
		Short: "Mint a " + kind + " token and print it",
		Args:  cobra.NoArgs,
	}
	flags := addAPIFlags(cmd)
	cmd.Flags().StringVar(&name, "name", "", "the "+kind+"'s name (required)")
	cmd.Flags().StringVar(&validFor, "valid-for", "", "how long the token is valid, e.g. 720h (default: until its key is retired)")
	if kind == auth.KindUser {
		cmd.Flags().StringSliceVar(&groups, "group", nil, "the user's groups: read-only or admin (required, repeatable)")
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if name == "" {
			return fmt.Errorf("--name is required")
		}
		if kind == auth.KindUser && len(groups) == 0 {
			return fmt.Errorf("--group is required: %s or %s", auth.GroupReadOnly, auth.GroupAdmin)
		}
		s, err := flags.session()
		if err != nil {
			return err
		}
		var resp controlplane.TokenResponse
		req := controlplane.TokenRequest{Name: name, Groups: groups, ValidFor: validFor}
		if err := s.client.PostJSON(cmd.Context(), "/api/tokens/"+kind, req, &resp); err != nil {
			return s.explain(err)
		}
		fmt.Fprintln(cmd.OutOrStdout(), resp.Token)
		return nil
	}
	return cmd
}

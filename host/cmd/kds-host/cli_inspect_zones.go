package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kds-host/kds-host/host/controlplane"
)

// zoneList is the answer of GET /api/zones (a global of the release before sends items and
// total only).
type zoneList struct {
	Summary *controlplane.ZoneSummary `json:"summary"`
	Items   []controlplane.ZoneView   `json:"items"`
	Total   int                       `json:"total"`
}

func newInspectZonesCmd() *cobra.Command {
	return inspectCmd(&cobra.Command{
		Use:   "zones",
		Short: "Show, per zone and kind, what the global sent, what the zone ACKed or NACKed, and what is withheld or parked",
		Long: `zones asks the global (--cp) for its view of every zone: per kind, the resources sent, the
ACKs and NACKs received, what the zone has ACKed (KNOWN), what the global withholds from it for
a missing owner (WITHHELD: owner holds), the names it rejected, and the retry state of its
stream (round, next retry, give-up) with the reason the retry policy gave for it (-o json shows
it whole; a decision of the built-in fallback says so, and why the policy in force did not
decide). Below the table, the names the retry policy parked: rejected names not resent until
their content changes (an INVALID spec), with the policy's reason.`,
	}, fmt.Sprintf("/api/zones?limit=%d", controlplane.MaxZonesLimit), printZones)
}

// cut shortens s to n runes for a table cell.
func cut(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-3]) + "..."
	}
	return s
}

// printZones prints the zones as a table: a row per zone and kind.
func printZones(cmd *cobra.Command, list zoneList) error {
	if len(list.Items) == 0 {
		fmt.Fprintln(cmd.ErrOrStderr(), "No zone has connected to this global yet.")
		return nil
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(cmd.OutOrStdout(), "SENT, KNOWN (the zone has ACKed) and WITHHELD (by owner holds) count resources; RESPONSES, ACKED and NACKED count responses.")
	fmt.Fprintln(tw, "ZONE\tKIND\tSENT\tKNOWN\tWITHHELD\tREJECTED\tRESPONSES\tACKED\tNACKED\tROUND\tNEXT RETRY\tREASON")
	for _, z := range list.Items {
		state := "connected"
		if !z.Connected {
			state = "disconnected"
		}
		round, next, reason, failing := "-", "-", "-", map[string]bool{}
		if z.Retry != nil {
			round = fmt.Sprint(z.Retry.Round)
			if z.Retry.Reason != "" {
				reason = cut(z.Retry.Reason, 60)
			}
			if z.Retry.NextRetry != nil {
				next = "in " + time.Until(*z.Retry.NextRetry).Round(time.Millisecond).String()
			}
			if z.Retry.GivenUp != "" {
				next = "given up"
			}
			for _, f := range z.Retry.Failing {
				failing[f.Kind] = true
			}
		}
		for _, k := range z.Kinds {
			names := make([]string, 0, len(k.Rejected))
			for _, r := range k.Rejected {
				if r.Cause != "" {
					names = append(names, r.Name+" ("+string(r.Cause)+")")
					continue
				}
				names = append(names, r.Name)
			}
			rejected := "-"
			if len(names) > 0 {
				rejected = strings.Join(names, ",")
				if len(rejected) > 60 {
					rejected = fmt.Sprintf("%d names", len(names))
				}
			}
			r, n, why := "-", "-", "-"
			if failing[k.Kind] {
				r, n, why = round, next, reason
			}
			withheld := k.Withheld
			if withheld == 0 {
				//lint:ignore SA1019 a global of the release before sends "held" only
				withheld = k.Held
			}
			fmt.Fprintf(tw, "%s (%s)\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", z.Zone, state, k.Kind, k.Sent, k.Known, withheld, rejected, k.Responses, k.ACKs, k.NACKs, r, n, why)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// What the retry policy parked: not resent until its content changes (an INVALID spec), and why.
	first := true
	for _, z := range list.Items {
		if z.Retry == nil {
			continue
		}
		for _, f := range z.Retry.Failing {
			parked := f.Parked
			if len(parked) == 0 {
				//lint:ignore SA1019 a global of the release before sends "held" only
				parked = f.Held
			}
			for _, h := range parked {
				if first {
					fmt.Fprintln(cmd.OutOrStdout(), "\nParked (not resent until their content changes):")
					first = false
				}
				fmt.Fprintf(cmd.OutOrStdout(), "  %s %s %s: %s\n", z.Zone, h.Kind, h.Name, h.Reason)
			}
		}
	}
	if len(list.Items) < list.Total {
		fmt.Fprintf(cmd.ErrOrStderr(), "\nShowing the first %d of %d zones (GET /api/zones pages them: ?offset=, ?state=, ?zone=).\n", len(list.Items), list.Total)
	}
	return nil
}

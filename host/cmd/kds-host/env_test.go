package main

import (
	"os"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// parsed runs only the flag parsing and environment binding of a command line, and returns the
// command it reached.
func parsed(t *testing.T, args ...string) *cobra.Command {
	t.Helper()
	root := newRootCmd()
	cmd, rest, err := root.Find(args)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatal(err)
	}
	if err := bindEnv(cmd); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func TestEnvironmentTwinsStayInTheirMode(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("KDS_ZONE_NAME", "zone-x") // set for a zone started from the same shell
	t.Setenv("KDS_PLUGIN", "./bin/retry-forcer")
	t.Setenv("KDS_CONFIG", "/etc/kds-host.yaml")

	global := parsed(t, "--mode", "global")
	g.Expect(global.Flags().Lookup("zone-name").Value.String()).To(BeEmpty(), "a zone's variable does not reach a global")
	g.Expect(global.Flags().Lookup("plugin").Value.String()).To(Equal("[./bin/retry-forcer]"))

	t.Setenv("KDS_MODE", "zone")
	zone := parsed(t)
	g.Expect(zone.Flags().Lookup("zone-name").Value.String()).To(Equal("zone-x"))
	g.Expect(zone.Flags().Lookup("plugin").Value.String()).To(Equal("[]"), "a global's variable does not reach a zone")
	g.Expect(zone.Flags().Lookup("config").Value.String()).To(BeEmpty())

	// A client command reads KDS_CLI_*, not the control plane's variables.
	verify := parsed(t, "plugin", "verify", "x")
	g.Expect(verify.Flags().Lookup("config").Value.String()).To(BeEmpty(), "KDS_CONFIG is the host's --config")
	t.Setenv("KDS_CLI_CONFIG", "policy.yaml")
	verify = parsed(t, "plugin", "verify", "x")
	g.Expect(verify.Flags().Lookup("config").Value.String()).To(Equal("policy.yaml"))
}

func TestARequiredFlagIsSatisfiedByItsTwin(t *testing.T) {
	g := NewWithT(t)
	cp := newGlobalAPI(t)
	t.Setenv("KDS_CLI_FILENAME", writeFile(t, "mesh.yaml", "type: Mesh\nname: default\n"))
	t.Setenv("KDS_CP", cp)
	r := runCLI(t, "", "apply")
	g.Expect(r.err).NotTo(HaveOccurred(), r.stderr)
	g.Expect(r.stdout).To(Equal("mesh \"default\" created\n"))
}

// The README lists every environment variable there is.
func TestTheREADMEListsEveryVariable(t *testing.T) {
	g := NewWithT(t)
	readme, err := os.ReadFile("../../../README.md")
	g.Expect(err).NotTo(HaveOccurred())
	var missing []string
	newRootCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(string(readme), "`"+EnvName(f.Name)+"`") {
			missing = append(missing, EnvName(f.Name))
		}
	})
	g.Expect(missing).To(BeEmpty(), "README.md does not list these variables")
	g.Expect(string(readme)).To(And(ContainSubstring("`KDS_CLI_"), ContainSubstring("`KDS_TOKEN`"), ContainSubstring("`KDS_CP`")))
}

// The arrival bound's flags are checked before anything starts, each error naming its flag.
func TestTheArrivalFlagsAreChecked(t *testing.T) {
	g := NewWithT(t)
	for flag, want := range map[string]string{
		"--kds-arrival-rate=-1": "--kds-arrival-rate -1: want 0 (no bound) or more",
		"--kds-arrival-burst=0": "--kds-arrival-burst 0: want 1 or more",
		"--kds-arrival-wait=0s": "--kds-arrival-wait 0s: want more than 0",
	} {
		r := runCLI(t, "", "--mode", "global", "--data-dir", t.TempDir(), flag)
		g.Expect(r.err).To(MatchError(want), flag)
	}
}

package launch_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/shared/launch"
)

// envBin is a plugin that writes its environment to $ENV_REPORT_FILE.
func envBin(t testing.TB) string { return testbin.Build(t, "./shared/launch/testdata/env") }

// readEnvReport reads what the env fixture wrote: its environment by name.
func readEnvReport(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the plugin's environment report: %v", err)
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("the plugin's environment report: %v", err)
	}
	env := map[string]string{}
	for _, kv := range list {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

// setHostSecrets puts into the test's environment what must never reach a plugin, and makes
// sure PATH, HOME and TMPDIR are set.
func setHostSecrets(t *testing.T) {
	t.Setenv("KDS_STORE", "postgres://kds:s3cret-db-password@db.example:5432/kds")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s3cret-cloud-key")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
	for _, n := range []string{"PATH", "HOME"} {
		if os.Getenv(n) == "" {
			t.Setenv(n, t.TempDir())
		}
	}
	t.Setenv("TMPDIR", os.TempDir())
}

func TestAPluginSeesOnlyTheAllowedEnvironment(t *testing.T) {
	g := NewWithT(t)
	bin := envBin(t) // built before the environment changes
	report := filepath.Join(t.TempDir(), "env.json")
	setHostSecrets(t)
	t.Setenv("ENV_REPORT_FILE", report)
	t.Setenv("PLUGIN_REGION", "eu-1")

	start(t, launch.Options{Path: bin, Env: []string{"ENV_REPORT_FILE", "PLUGIN_REGION", "NOT_SET_ANYWHERE"}})
	env := readEnvReport(t, report)

	names := make([]string, 0, len(env))
	for n := range env {
		names = append(names, n)
	}
	g.Expect(names).To(ConsistOf(
		"PATH", "HOME", "TMPDIR", // every plugin's
		"ENV_REPORT_FILE", "PLUGIN_REGION", // allowed
		"KDS_HOST_PLUGIN", "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS", "PLUGIN_CLIENT_CERT", // go-plugin's
		"PLUGIN_UNIX_SOCKET_DIR", // the folder of its socket, the launcher's
	))
	for _, n := range []string{"PATH", "HOME", "TMPDIR", "PLUGIN_REGION"} {
		g.Expect(env).To(HaveKeyWithValue(n, os.Getenv(n)))
	}
	g.Expect(env).To(HaveKeyWithValue("KDS_HOST_PLUGIN", "6f1d8c0e-kds-host-plugin-protocol"))
	for n, v := range env {
		g.Expect(v).NotTo(ContainSubstring("s3cret"), "%s leaks a secret", n)
	}
}

func TestWithoutAnAllowListAPluginSeesTheBaseEnvironmentOnly(t *testing.T) {
	g := NewWithT(t)
	// The fixture reports only to a file it is told of: the file's name is an allowed
	// variable, and a second start without it writes nothing.
	bin := envBin(t)
	report := filepath.Join(t.TempDir(), "env.json")
	setHostSecrets(t)
	t.Setenv("ENV_REPORT_FILE", report)
	p := start(t, launch.Options{Path: bin})
	g.Expect(describe(p)).To(Equal("env"))
	g.Expect(report).NotTo(BeAnExistingFile(), "ENV_REPORT_FILE was not allowed")
}

func TestCheckEnv(t *testing.T) {
	for _, tc := range []struct {
		names []string
		err   string
	}{
		{nil, ""},
		{[]string{"AWS_REGION", "lower_case", "PATH"}, ""},
		{[]string{"OK", ""}, "an empty environment variable name"},
		{[]string{"A=b"}, `environment variable "A=b": give a name alone; the plugin gets the host's value`},
		{[]string{"A\x00"}, "cannot hold a NUL byte"},
	} {
		g := NewWithT(t)
		err := launch.CheckEnv(tc.names)
		if tc.err == "" {
			g.Expect(err).NotTo(HaveOccurred())
			continue
		}
		g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
	}

	g := NewWithT(t)
	_, err := launch.Start(t.Context(), launch.Options{Path: "/bin/true", Env: []string{"A=b"}})
	g.Expect(err).To(MatchError(`plugin /bin/true: environment variable "A=b": give a name alone; the plugin gets the host's value`))
}

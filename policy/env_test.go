package policy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/testbin"
	"github.com/kds-host/kds-host/policy"
)

// envBin is a plugin that writes its environment to $ENV_REPORT_FILE (Describe name "env").
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

// setHostSecrets puts into the host's environment what must never reach a plugin, and makes
// sure PATH, HOME and TMPDIR are set.
func setHostSecrets(t *testing.T) {
	t.Setenv("KDS_STORE", "postgres://kds:s3cret-db-password@db.example:5432/kds")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "s3cret-cloud-key")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "/etc/s3cret/key.json")
	for _, n := range []string{"PATH", "HOME"} {
		if os.Getenv(n) == "" {
			t.Setenv(n, t.TempDir())
		}
	}
	t.Setenv("TMPDIR", os.TempDir())
}

// goPluginEnv is what go-plugin adds to every plugin's environment, and the folder of its socket.
var goPluginEnv = []string{"KDS_HOST_PLUGIN", "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS", "PLUGIN_CLIENT_CERT", "PLUGIN_UNIX_SOCKET_DIR"}

func TestAPluginSeesOnlyTheAllowedEnvironment(t *testing.T) {
	g := NewWithT(t)
	bin := envBin(t) // built before the environment changes
	dir := t.TempDir()
	report := filepath.Join(dir, "env.json")
	setHostSecrets(t)
	t.Setenv("ENV_REPORT_FILE", report)
	t.Setenv("PLUGIN_REGION", "eu-1")

	// The runtime's list (--plugin-env) and the plugin's own (a --config file's env).
	cfgFile := filepath.Join(dir, "kds.yaml")
	g.Expect(os.WriteFile(cfgFile, []byte("plugins:\n  - path: "+bin+"\n    env: [PLUGIN_REGION]\n"), 0o600)).To(Succeed())
	p, err := policy.LoadFile(cfgFile)
	g.Expect(err).NotTo(HaveOccurred())
	cfg := config(p.List...)
	cfg.Env = []string{"ENV_REPORT_FILE"}
	rt := start(t, cfg)

	env := readEnvReport(t, report)
	g.Expect(env).NotTo(HaveKey("KDS_STORE"))
	g.Expect(env).NotTo(HaveKey("AWS_SECRET_ACCESS_KEY"))
	names := make([]string, 0, len(env))
	for n := range env {
		names = append(names, n)
	}
	g.Expect(names).To(ConsistOf(append([]string{"PATH", "HOME", "TMPDIR", "ENV_REPORT_FILE", "PLUGIN_REGION"}, goPluginEnv...)))
	for _, n := range []string{"PATH", "HOME", "TMPDIR", "ENV_REPORT_FILE", "PLUGIN_REGION"} {
		g.Expect(env).To(HaveKeyWithValue(n, os.Getenv(n)))
	}
	for n, v := range env {
		g.Expect(v).NotTo(ContainSubstring("s3cret"), "%s leaks a secret", n)
	}
	g.Expect(statusOf(rt, "env").Env).To(Equal([]string{"ENV_REPORT_FILE", "PLUGIN_REGION"}), "the status names what it sees, never the values")

	// A restarted process sees the same.
	g.Expect(os.Remove(report)).To(Succeed())
	pid := statusOf(rt, "env").PID
	g.Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
	g.Eventually(func() bool { st := statusOf(rt, "env"); return st.State == policy.StateRunning && st.PID != pid }, patience).Should(BeTrue())
	g.Expect(readEnvReport(t, report)).To(HaveLen(len(env)))
}

func TestABadEnvironmentNameIsRefused(t *testing.T) {
	g := NewWithT(t)
	cfg := config()
	cfg.Env = []string{"AWS_REGION=eu-1"}
	_, err := policy.New(cfg)
	g.Expect(err).To(MatchError(`the plugins' environment: environment variable "AWS_REGION=eu-1": give a name alone; the plugin gets the host's value`))
}

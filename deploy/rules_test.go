package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"go.yaml.in/yaml/v3"

	"github.com/kds-host/kds-host/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// promtool returns the path of Prometheus's promtool. Without it the test is skipped with what
// to install, or fails when CI is set (CI=true: a CI machine must have it).
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		msg := "promtool is not installed: `make test-deps` installs it (Debian's prometheus package: apt-get install prometheus)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// ruleTests are the promtool unit test files of the rules.
func ruleTests(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("prometheus", "*_test.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool test files under prometheus/: %v", err)
	}
	return files
}

// The rules are valid for Prometheus and pass their unit tests: each alert fires when and only
// when its tests say, with the labels and annotations they give.
func TestTheRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
	run("check", "rules", filepath.Base(rulesFile))
	tests := []string{"test", "rules"}
	for _, f := range ruleTests(t) {
		tests = append(tests, filepath.Base(f))
	}
	run(tests...)
}

// headingRE is a second-level heading of the runbook.
var headingRE = regexp.MustCompile(`(?m)^## (.+)$`)

// anchor is the fragment GitHub gives a heading: lower case, spaces to hyphens, punctuation
// other than hyphens and underscores dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// runbookURL is where every alert's runbook_url points, before the section's anchor.
const runbookURL = "https://github.com/kds-host/kds-host/blob/main/docs/runbook.md#"

// Every alert can be acted on: a severity, a summary, a description, and a runbook_url that
// points to a section of docs/runbook.md; every section of the runbook is an alert's; and every
// alert has a promtool test in which it fires.
func TestEveryAlertHasARunbookSectionAndATestThatFiresIt(t *testing.T) {
	g := NewWithT(t)
	rf, err := readRules(rulesFile)
	g.Expect(err).NotTo(HaveOccurred())
	b, err := os.ReadFile(runbookFile)
	g.Expect(err).NotTo(HaveOccurred())
	sections := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(string(b), -1) {
		sections[anchor(m[1])] = true
	}

	fired := map[string]bool{}
	for _, f := range ruleTests(t) {
		var tf struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		data, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(yaml.Unmarshal(data, &tf)).To(Succeed(), f)
		for _, tc := range tf.Tests {
			for _, at := range tc.AlertRuleTest {
				if len(at.ExpAlerts) > 0 {
					fired[at.Alertname] = true
				}
			}
		}
	}

	var alerts []string
	linked := map[string]bool{}
	for _, grp := range rf.Groups {
		for _, r := range grp.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			g.Expect(r.Labels).To(HaveKeyWithValue("severity", BeElementOf("critical", "warning")), r.Alert)
			g.Expect(r.Annotations).To(HaveKeyWithValue("summary", Not(BeEmpty())), r.Alert)
			g.Expect(r.Annotations).To(HaveKeyWithValue("description", Not(BeEmpty())), r.Alert)
			url := r.Annotations["runbook_url"]
			section, ok := strings.CutPrefix(url, runbookURL)
			g.Expect(ok).To(BeTrue(), "%s: runbook_url %q is not a section of docs/runbook.md (%s...)", r.Alert, url, runbookURL)
			g.Expect(sections).To(HaveKey(section), "%s: runbook_url %q names no section of docs/runbook.md", r.Alert, url)
			linked[section] = true
			g.Expect(fired).To(HaveKey(r.Alert), "%s: no promtool test (prometheus/*_test.yaml) expects it to fire", r.Alert)
		}
	}
	g.Expect(alerts).NotTo(BeEmpty())
	g.Expect(slices.Compact(slices.Sorted(slices.Values(alerts)))).To(HaveLen(len(alerts)), "alert names are unique")
	for s := range sections {
		g.Expect(linked).To(HaveKey(s), "docs/runbook.md section #%s is no alert's runbook_url", s)
	}
}

// Every recording rule is read by an alert, another recording rule or a dashboard panel: a rule
// nothing reads costs Prometheus an evaluation and a series for nothing.
func TestEveryRecordingRuleIsRead(t *testing.T) {
	g := NewWithT(t)
	rf, err := readRules(rulesFile)
	g.Expect(err).NotTo(HaveOccurred())
	dashboard, err := os.ReadFile(dashboardFile)
	g.Expect(err).NotTo(HaveOccurred())
	qs, recorded := ruleQueries(rulesFile, rf)
	g.Expect(recorded).NotTo(BeEmpty())
	var unread []string
	for _, name := range recorded {
		read := strings.Contains(string(dashboard), name)
		for _, q := range qs {
			read = read || strings.Contains(q.expr, name)
		}
		if !read {
			unread = append(unread, name)
		}
	}
	g.Expect(unread).To(BeEmpty(), "recording rules that no alert, rule or panel reads: drop them or use them")
}

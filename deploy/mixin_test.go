package deploy

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-jsonnet"
	. "github.com/onsi/gomega"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "write the mixin's rendering over deploy/prometheus/kds-host-rules.yaml and deploy/grafana/kds-host.json")

// rulesHeader heads the rendered rule file.
const rulesHeader = `# Prometheus recording and alerting rules for kds-host, rendered from the monitoring mixin
# (deploy/mixin/mixin.libsonnet) with its default _config: edit the mixin, then run
# go test ./deploy -run TestTheMixinRendersTheShippedRulesAndDashboard -update
# Load this file with rule_files in prometheus.yml, and scrape every global replica and every zone
# on its diagnostics address (/metrics; ports 5680 global, 15680 zone) with a job name that starts
# with "kds-host". Each alert's runbook_url is a section of docs/runbook.md. The rules are tested
# with promtool (deploy/prometheus/*_test.yaml).
`

// mixin renders deploy/mixin with config (a jsonnet object merged into _config) and returns its
// rule file and its dashboard.
func mixin(t *testing.T, config string) (rules, dashboard string) {
	t.Helper()
	vm := jsonnet.MakeVM()
	vm.Importer(&jsonnet.FileImporter{JPaths: []string{"mixin"}})
	out, err := vm.EvaluateAnonymousSnippet("render.jsonnet", `
		local m = (import 'mixin.libsonnet') + { _config+:: `+config+` };
		{ rules: m.prometheusRulesYAML, dashboard: std.manifestJsonEx(m.grafanaDashboards['kds-host.json'], '  ') }`)
	if err != nil {
		t.Fatalf("render the mixin: %v", err)
	}
	var r struct{ Rules, Dashboard string }
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	return rulesHeader + r.Rules + "\n", r.Dashboard + "\n"
}

// The rule file and the dashboard deploy ships are the mixin's rendering with its defaults, so
// the promtool tests and the real global's metrics check what the mixin makes.
func TestTheMixinRendersTheShippedRulesAndDashboard(t *testing.T) {
	g := NewWithT(t)
	rules, dashboard := mixin(t, "{}")
	if *update {
		g.Expect(os.WriteFile(rulesFile, []byte(rules), 0o644)).To(Succeed())
		g.Expect(os.WriteFile(dashboardFile, []byte(dashboard), 0o644)).To(Succeed())
	}
	shippedRules, err := os.ReadFile(rulesFile)
	g.Expect(err).NotTo(HaveOccurred())
	shippedDashboard, err := os.ReadFile(dashboardFile)
	g.Expect(err).NotTo(HaveOccurred())
	const fix = "; edit deploy/mixin, then: go test ./deploy -run TestTheMixinRendersTheShippedRulesAndDashboard -update"
	g.Expect(string(shippedRules)).To(Equal(rules), rulesFile+" is not the mixin's rendering"+fix)
	g.Expect(string(shippedDashboard)).To(Equal(dashboard), dashboardFile+" is not the mixin's rendering"+fix)
}

// The mixin follows its _config: the job selector, the cluster label kept by every aggregation,
// the runbook URL pattern and the dashboard URL land in the rules, which promtool accepts, and in
// the dashboard's cluster, job and instance variables.
func TestTheMixinFollowsItsConfig(t *testing.T) {
	g := NewWithT(t)
	rules, dashboard := mixin(t, `{ kdsSelector: 'job="kds"', clusterLabel: 'k8s_cluster',
		runbookURLPattern: 'https://runbooks.example/kds/%s.md', dashboardURL: 'https://grafana.example/d/kds' }`)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	g.Expect(os.WriteFile(path, []byte(rules), 0o644)).To(Succeed())
	if out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	var rf ruleFile
	g.Expect(yaml.Unmarshal([]byte(rules), &rf)).To(Succeed())
	alerts := 0
	for _, grp := range rf.Groups {
		for _, r := range grp.Rules {
			g.Expect(r.Expr).NotTo(ContainSubstring("kds-host.*"), r.Record+r.Alert)
			if strings.Contains(r.Expr, " by (") {
				g.Expect(r.Expr).To(ContainSubstring("by (k8s_cluster"), r.Record+r.Alert)
			}
			if r.Alert == "" {
				continue
			}
			alerts++
			g.Expect(r.Annotations).To(HaveKeyWithValue("runbook_url", "https://runbooks.example/kds/"+strings.ToLower(r.Alert)+".md"))
			g.Expect(r.Annotations).To(HaveKeyWithValue("dashboard_url", "https://grafana.example/d/kds"))
			if r.Alert == "KDSHostDown" {
				g.Expect(r.Expr).To(HavePrefix(`up{job="kds"}`))
			}
		}
	}
	g.Expect(alerts).To(BeNumerically(">=", 20))

	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	g.Expect(json.Unmarshal([]byte(dashboard), &d)).To(Succeed())
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Definition
	}
	g.Expect(vars).To(HaveKeyWithValue("cluster", `label_values(up{job="kds"}, k8s_cluster)`))
	g.Expect(vars).To(HaveKeyWithValue("job", `label_values(up{job="kds", k8s_cluster=~"$cluster"}, job)`))
	g.Expect(vars).To(HaveKeyWithValue("instance", `label_values(up{job="kds", k8s_cluster=~"$cluster", job=~"$job"}, instance)`))
	g.Expect(dashboard).To(ContainSubstring(`kds_streams{k8s_cluster=~\"$cluster\", job=~\"$job\", instance=~\"$instance\"}`))
}

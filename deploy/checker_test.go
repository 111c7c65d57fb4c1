package deploy

import (
	"testing"

	. "github.com/onsi/gomega"
	"go.yaml.in/yaml/v3"
)

// The metric check fails on what no global or zone exports: a rule, a panel, a row's nested
// panel or a variable naming a made-up metric, a selector by regular expression, a query that
// does not parse. What is exported, recorded by a rule or made by Prometheus (up, ALERTS) passes.
func TestTheMetricCheckReportsWhatNoGlobalOrZoneExports(t *testing.T) {
	g := NewWithT(t)
	var rf ruleFile
	g.Expect(yaml.Unmarshal([]byte(`
groups:
  - name: test
    rules:
      - record: kds:nacks:rate5m
        expr: sum by (zone) (rate(kds_nacks_total[5m]))
      - alert: Fine
        expr: kds:nacks:rate5m > 1 or up == 0
      - alert: Bogus
        expr: increase(kds_bogus_total[5m]) > 0
`), &rf)).To(Succeed())
	qs, recorded := ruleQueries("rules.yaml", rf)
	g.Expect(recorded).To(Equal([]string{"kds:nacks:rate5m"}))

	dq, err := dashboardQueries("dash.json", []byte(`{
  "templating": {"list": [
    {"name": "datasource", "type": "datasource", "query": "prometheus"},
    {"name": "zone", "type": "query", "query": {"query": "label_values(kds_also_made_up{kind=~\"$kind\"}, zone)"}},
    {"name": "kind", "type": "query", "query": "label_values(kds_nacks_total, kind)"}
  ]},
  "panels": [
    {"id": 1, "title": "fine", "targets": [
      {"refId": "A", "expr": "histogram_quantile(0.99, sum by (le) (rate(kds_retry_delay_seconds_bucket{zone=~\"${zone}\"}[$__rate_interval])))"},
      {"refId": "B", "expr": "count(ALERTS{alertstate=\"firing\"})"}]},
    {"id": 2, "title": "bogus", "targets": [{"refId": "A", "expr": "sum(rate(kds_made_up_seconds_bucket[$__rate_interval]))"}]},
    {"id": 3, "type": "row", "title": "a row", "panels": [
      {"id": 4, "title": "nested", "targets": [{"refId": "A", "expr": "kds_nested_bogus"}]}]},
    {"id": 5, "title": "by regexp", "targets": [{"refId": "A", "expr": "{__name__=~\"kds_.*\"}"}]},
    {"id": 6, "title": "broken", "targets": [{"refId": "A", "expr": "sum(kds_nacks_total"}]}
  ]
}`))
	g.Expect(err).NotTo(HaveOccurred())
	exported := map[string]bool{}
	exportedNames(exported, "# HELP kds_nacks_total NACKs.\n# TYPE kds_nacks_total counter\n"+
		`kds_nacks_total{kind="Mesh",zone="zone-1"} 3`+"\n"+
		`kds_retry_delay_seconds_bucket{le="0.01"} 0`+"\nkds_retry_delay_seconds_count 0\n")
	g.Expect(exported).To(HaveLen(3))

	problems := unknownMetrics(append(qs, dq...), exported, recorded)
	g.Expect(problems).To(ConsistOf(
		ContainSubstring("rules.yaml: alert Bogus: kds_bogus_total is exported by no global or zone"),
		ContainSubstring("dash.json: panel 2 \"bogus\", target A: kds_made_up_seconds_bucket is exported by no global or zone"),
		ContainSubstring("dash.json: panel 4 \"nested\", target A: kds_nested_bogus is exported"),
		ContainSubstring("dash.json: variable zone: kds_also_made_up is exported"),
		And(ContainSubstring("dash.json: panel 5 \"by regexp\""), ContainSubstring("name each metric")),
		ContainSubstring("dash.json: panel 6 \"broken\""),
	))

	// A variable query the check cannot read is refused, not skipped.
	_, err = dashboardQueries("dash.json", []byte(`{"templating": {"list": [{"name": "m", "type": "query", "query": "metrics(kds_.*)"}]}}`))
	g.Expect(err).To(MatchError(ContainSubstring("variable m")))
}

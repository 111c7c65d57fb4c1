package deploy

import (
	"encoding/json"
	"os"
	"testing"

	. "github.com/onsi/gomega"
)

// The dashboard imports into Grafana as it is (Dashboards > New > Import): it has a uid, a title
// and a schema version, asks for its Prometheus data source on import (__inputs) and lets the
// viewer change it (a datasource variable every panel follows), has the zone and kind variables
// its queries use, and its panels each have an id of their own, a place on the grid and, but for
// rows, queries with a refId.
func TestTheDashboardIsImportable(t *testing.T) {
	g := NewWithT(t)
	data, err := os.ReadFile(dashboardFile)
	g.Expect(err).NotTo(HaveOccurred())
	var d struct {
		Inputs []struct {
			Name, Type, PluginID string
		} `json:"__inputs"`
		UID           string  `json:"uid"`
		Title         string  `json:"title"`
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Name, Type string
				Query      any
				Current    map[string]any
				Datasource json.RawMessage
			}
		}
	}
	g.Expect(json.Unmarshal(data, &d)).To(Succeed())
	g.Expect(d.UID).NotTo(BeEmpty())
	g.Expect(d.Title).NotTo(BeEmpty())
	g.Expect(d.SchemaVersion).To(BeNumerically(">=", 36), "Grafana 10 and later")
	g.Expect(d.Inputs).To(ContainElement(And(HaveField("Name", "DS_PROMETHEUS"), HaveField("Type", "datasource"), HaveField("PluginID", "prometheus"))))

	followsVariable := `{"type":"prometheus","uid":"${datasource}"}`
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		switch v.Type {
		case "datasource":
			g.Expect(v.Name).To(Equal("datasource"))
			g.Expect(v.Query).To(Equal("prometheus"))
			g.Expect(v.Current).To(HaveKeyWithValue("value", "${DS_PROMETHEUS}"), "the import's data source is the default")
		case "query":
			g.Expect(v.Datasource).To(MatchJSON(followsVariable), "variable %s", v.Name)
		}
	}
	g.Expect(vars).To(HaveKey("datasource"))
	g.Expect(vars).To(HaveKey("zone"))
	g.Expect(vars).To(HaveKey("kind"))

	ids := map[int]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			g.Expect(ids).NotTo(HaveKey(p.ID), "panel id %d (%q) is used twice", p.ID, p.Title)
			ids[p.ID] = true
			g.Expect(p.ID).To(BeNumerically(">", 0), "panel %q has no id", p.Title)
			g.Expect(p.Title).NotTo(BeEmpty(), "panel %d has no title", p.ID)
			g.Expect(p.GridPos).NotTo(BeNil(), "panel %q has no gridPos", p.Title)
			g.Expect(p.GridPos.W).To(BeNumerically(">", 0))
			g.Expect(p.GridPos.X+p.GridPos.W).To(BeNumerically("<=", 24), "panel %q is wider than the grid", p.Title)
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			g.Expect(p.Datasource).To(MatchJSON(followsVariable), "panel %q", p.Title)
			g.Expect(p.Targets).NotTo(BeEmpty(), "panel %q has no query", p.Title)
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				g.Expect(tg.RefID).NotTo(BeEmpty(), "panel %q", p.Title)
				g.Expect(refs).NotTo(HaveKey(tg.RefID), "panel %q: refId %s twice", p.Title, tg.RefID)
				refs[tg.RefID] = true
				g.Expect(tg.Expr).NotTo(BeEmpty(), "panel %q target %s", p.Title, tg.RefID)
				for _, m := range grafanaVarRE.FindAllStringSubmatch(tg.Expr, -1) {
					name := m[1] + m[2]
					g.Expect(vars[name] || name == "__rate_interval" || name == "__interval" || name == "__range").
						To(BeTrue(), "panel %q uses $%s, which is no variable of the dashboard", p.Title, name)
				}
			}
		}
	}
	walk(d.Panels)
	g.Expect(len(ids)).To(BeNumerically(">=", 20))

	// Every query parses as PromQL (what it names is checked against a real global and zone by
	// TestEveryQueriedMetricIsExportedByARealGlobalOrZone).
	qs, err := dashboardQueries(dashboardFile, data)
	g.Expect(err).NotTo(HaveOccurred())
	for _, q := range qs {
		_, err := metricNames(q.expr)
		g.Expect(err).NotTo(HaveOccurred(), q.where)
	}
}

// The dashboard shows every latency histogram and the gRPC codes the control plane exports: how
// long a response takes to be ACKed and a write to reach the last zone, the API's and the store's
// durations, and how KDS streams end.
func TestTheDashboardShowsTheLatencyHistogramsAndTheGRPCCodes(t *testing.T) {
	g := NewWithT(t)
	data, err := os.ReadFile(dashboardFile)
	g.Expect(err).NotTo(HaveOccurred())
	qs, err := dashboardQueries(dashboardFile, data)
	g.Expect(err).NotTo(HaveOccurred())
	shown := map[string]bool{}
	for _, q := range qs {
		names, err := metricNames(q.expr)
		g.Expect(err).NotTo(HaveOccurred(), q.where)
		for _, n := range names {
			shown[n] = true
		}
	}
	for _, name := range []string{"kds_response_ack_seconds_bucket", "kds_convergence_seconds_bucket", "kds_api_request_seconds_bucket",
		"kds_api_request_seconds_count", "kds_store_operation_seconds_bucket", "kds_grpc_server_handled_total"} {
		g.Expect(shown).To(HaveKey(name), "no panel queries %s", name)
	}
}

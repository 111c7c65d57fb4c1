package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// The files under test, from this package's folder.
var (
	rulesFile     = filepath.Join("prometheus", "kds-host-rules.yaml")
	dashboardFile = filepath.Join("grafana", "kds-host.json")
	runbookFile   = filepath.Join("..", "docs", "runbook.md")
)

// synthetic are the series Prometheus makes itself rather than scraping them: a rule or a panel
// may name them though no kds-host exports them.
var synthetic = map[string]bool{
	"up":     true, // 1 when the target's last scrape succeeded (KDSHostDown)
	"ALERTS": true, // the alerts pending and firing (the dashboard's count of firing alerts)
}

// query is one PromQL expression a rule or a panel runs, and where it is.
type query struct {
	where string
	expr  string
}

// ruleFile is what the checks read of a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(path string) (ruleFile, error) {
	var rf ruleFile
	b, err := os.ReadFile(path)
	if err != nil {
		return rf, err
	}
	if err := yaml.Unmarshal(b, &rf); err != nil {
		return rf, fmt.Errorf("%s: %w", path, err)
	}
	return rf, nil
}

// ruleQueries returns the expression of every rule in the file named name, and the names its
// recording rules define.
func ruleQueries(name string, rf ruleFile) (qs []query, recorded []string) {
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			what := "alert " + r.Alert
			if r.Record != "" {
				what = "record " + r.Record
				recorded = append(recorded, r.Record)
			}
			qs = append(qs, query{where: fmt.Sprintf("%s: %s", name, what), expr: r.Expr})
		}
	}
	return qs, recorded
}

// dashboardQueries returns the expression of every panel target (in rows too) and of every query
// variable of a Grafana dashboard in JSON, the file named name.
func dashboardQueries(name string, data []byte) ([]query, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var qs []query
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, query{where: fmt.Sprintf("%s: panel %d %q, target %s", name, p.ID, p.Title, tg.RefID), expr: tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.Query
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		s, _ := q.(string)
		expr, err := variableExpr(s)
		where := fmt.Sprintf("%s: variable %s", name, v.Name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if expr != "" {
			qs = append(qs, query{where: where, expr: expr})
		}
	}
	return qs, nil
}

// panel is what the checks read of a Grafana panel.
type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var (
	labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`)
	labelOnlyRE   = regexp.MustCompile(`^label_values\(\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`)
	queryResultRE = regexp.MustCompile(`^query_result\((.*)\)$`)
)

// variableExpr is the PromQL a Grafana Prometheus variable query runs: label_values(SELECTOR,
// LABEL) and query_result(EXPR) name metrics; label_values(LABEL) and label_names() name none.
func variableExpr(q string) (string, error) {
	q = strings.TrimSpace(q)
	switch {
	case labelOnlyRE.MatchString(q), strings.HasPrefix(q, "label_names("):
		return "", nil
	case labelValuesRE.MatchString(q):
		return labelValuesRE.FindStringSubmatch(q)[1], nil
	case queryResultRE.MatchString(q):
		return queryResultRE.FindStringSubmatch(q)[1], nil
	}
	return "", fmt.Errorf("variable query %q: want label_values(SELECTOR, LABEL) or query_result(EXPR), which name their metrics", q)
}

// grafanaVarRE is a Grafana variable in a panel's query: $name, ${name} or ${name:format}.
var grafanaVarRE = regexp.MustCompile(`\$\{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-zA-Z]+)?\}|\$([a-zA-Z_][a-zA-Z0-9_]*)`)

// expandGrafana replaces Grafana's variables with values PromQL parses: a duration for the
// interval variables, a word for the others (which the dashboard uses in label matchers only).
func expandGrafana(expr string) string {
	return grafanaVarRE.ReplaceAllStringFunc(expr, func(v string) string {
		m := grafanaVarRE.FindStringSubmatch(v)
		name := m[1] + m[2]
		switch name {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		case "__interval_ms", "__range_ms", "__range_s":
			return "300"
		}
		return "x"
	})
}

// metricNames parses expr (Grafana variables expanded) and returns the metric names its
// selectors name. A selector that picks metrics by a regular expression, or names none, is an
// error: the check could not tell what it reads.
func metricNames(expr string) ([]string, error) {
	e, err := parser.ParseExpr(expandGrafana(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name != labels.MetricName {
				continue
			}
			if m.Type != labels.MatchEqual {
				bad = fmt.Errorf("%s selects metrics by %s: name each metric", vs, m)
				return nil
			}
			name = m.Value
		}
		if name == "" {
			bad = fmt.Errorf("%s names no metric", vs)
			return nil
		}
		names = append(names, name)
		return nil
	})
	return names, bad
}

// unknownMetrics checks every query: what it names must be exported (a name as a scrape shows
// it: a histogram's _bucket, _sum and _count), recorded by a rule, or made by Prometheus itself.
// It returns one line per problem: a query that does not parse, or a name nothing has.
func unknownMetrics(qs []query, exported map[string]bool, recorded []string) []string {
	var problems []string
	for _, q := range qs {
		names, err := metricNames(q.expr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", q.where, err))
			continue
		}
		for _, n := range names {
			if !exported[n] && !synthetic[n] && !slices.Contains(recorded, n) {
				problems = append(problems, fmt.Sprintf("%s: %s is exported by no global or zone and recorded by no rule", q.where, n))
			}
		}
	}
	return problems
}

// allQueries reads the rules and the dashboard of this repository.
func allQueries() (qs []query, recorded []string, err error) {
	rf, err := readRules(rulesFile)
	if err != nil {
		return nil, nil, err
	}
	qs, recorded = ruleQueries(rulesFile, rf)
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		return nil, nil, err
	}
	dq, err := dashboardQueries(dashboardFile, b)
	if err != nil {
		return nil, nil, err
	}
	return append(qs, dq...), recorded, nil
}

// exportedNames adds the metric name of every sample line of a /metrics answer (the text
// format) to names.
func exportedNames(names map[string]bool, scrape string) {
	for _, line := range strings.Split(scrape, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
}

// The kds-host monitoring mixin: the Prometheus recording and alerting rules and the Grafana
// dashboard, configured by _config. Render it with go-jsonnet or jsonnet, e.g.
//   jsonnet -S -e '(import "mixin.libsonnet").prometheusRulesYAML'
// deploy/prometheus/kds-host-rules.yaml and deploy/grafana/kds-host.json are its rendering with
// the defaults (deploy's TestTheMixinRendersTheShippedRulesAndDashboard keeps them so).
local rules = import 'rules.libsonnet';
local dashboard = import 'dashboard.json';

{
  _config+:: {
    // The scrape jobs of every kds-host global and zone (KDSHostDown, kds:global_up:max, the
    // dashboard's job variable).
    kdsSelector: 'job=~"kds-host.*"',
    // The label that tells clusters (Prometheus instances' external labels, or a relabelling)
    // apart: kept by every aggregation and match, and the dashboard's cluster variable.
    clusterLabel: 'cluster',
    // Each alert's runbook_url: the pattern with the alert's name in lower case.
    runbookURLPattern: 'https://github.com/kds-host/kds-host/blob/main/docs/runbook.md#%s',
    // Each alert's dashboard_url, when not empty (e.g. https://grafana.example/d/kds-host).
    dashboardURL: '',
    // The dashboard's uid and title.
    dashboardUID: 'kds-host',
    dashboardTitle: 'kds-host',
  },

  local config = self._config,
  local formatted(r) = r { expr: r.expr % config },
  local annotated(r) = formatted(r) {
    annotations+: { runbook_url: config.runbookURLPattern % std.asciiLower(r.alert) }
                  + (if config.dashboardURL != '' then { dashboard_url: config.dashboardURL } else {}),
  },

  prometheusRules+:: {
    groups+: [{ name: 'kds-host.recording', rules: [formatted(r) for r in rules.recording] }],
  },

  prometheusAlerts+:: {
    groups+: [{ name: 'kds-host.alerts', rules: [annotated(r) for r in rules.alerts] }],
  },

  // Both, as one rule file (what deploy/prometheus/kds-host-rules.yaml is).
  prometheusRulesYAML:: std.manifestYamlDoc(
    { groups: $.prometheusRules.groups + $.prometheusAlerts.groups }, indent_array_in_object=true, quote_keys=false
  ),

  local variable(name, label, query) = {
    name: name,
    label: label,
    type: 'query',
    datasource: { type: 'prometheus', uid: '${datasource}' },
    query: { query: query, refId: 'PrometheusVariableQueryEditor-VariableQuery' },
    definition: query,
    refresh: 2,
    sort: 1,
    multi: true,
    includeAll: true,
    allValue: '.*',
    current: {},
    hide: 0,
    options: [],
    regex: '',
  },
  local formatPanels(ps) = [
    p + (if std.objectHas(p, 'targets') then { targets: [t { expr: t.expr % config } for t in p.targets] } else {})
    + (if std.objectHas(p, 'panels') then { panels: formatPanels(p.panels) } else {})
    for p in ps
  ],
  local sourceVars = dashboard.templating.list,

  grafanaDashboards+:: {
    'kds-host.json': dashboard {
      uid: config.dashboardUID,
      title: config.dashboardTitle,
      links: [l { url: std.rstripChars(config.runbookURLPattern % '', '#') } for l in dashboard.links],
      templating: {
        list: [sourceVars[0]] + [
          variable('cluster', 'Cluster', 'label_values(up{%(kdsSelector)s}, %(clusterLabel)s)' % config),
          variable('job', 'Job', 'label_values(up{%(kdsSelector)s, %(clusterLabel)s=~"$cluster"}, job)' % config),
          variable('instance', 'Instance', 'label_values(up{%(kdsSelector)s, %(clusterLabel)s=~"$cluster", job=~"$job"}, instance)' % config),
        ] + [v + { query+: { query: v.query.query % config }, definition: v.definition % config } for v in sourceVars[1:]],
      },
      panels: formatPanels(dashboard.panels),
    },
  },
}

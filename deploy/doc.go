// Package deploy holds what runs kds-host beside Prometheus and Grafana: the monitoring mixin
// (mixin/mixin.libsonnet) and its rendering with the defaults, the recording and alerting rules
// (prometheus/kds-host-rules.yaml, with promtool unit tests) and the dashboard
// (grafana/kds-host.json). It has no Go code of its own; its tests run promtool on the rules and
// check that every metric a rule or a panel queries is exported by a real global or zone.
package deploy

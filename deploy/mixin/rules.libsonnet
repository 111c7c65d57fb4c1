// The rules of the kds-host mixin (mixin.libsonnet). Each expr is formatted with $._config
// (kdsSelector: the scrape jobs of kds-host; clusterLabel: kept by every aggregation and
// match); each alert gets its runbook_url (and dashboard_url) in mixin.libsonnet.
{
  recording: [
    {
      record: "kds:zone_connected:max",
      expr: "max by (%(clusterLabel)s, zone) (kds_zone_connected)",
    },
    {
      record: "kds:global_up:max",
      expr: "max by (%(clusterLabel)s) (up{%(kdsSelector)s} and on (%(clusterLabel)s, instance, job) present_over_time(kds_streams[1h]))",
    },
    {
      // 1 for a zone whose own process Prometheus has not scraped for 2 minutes (KDSHostDown
      // pages for it); the zone's name is that of the last kds_zone_client_connected its
      // process exported within an hour.
      record: "kds:zone_process_down:max",
      expr: |||
        max by (%(clusterLabel)s, zone) (
          group by (%(clusterLabel)s, instance, job, zone) (last_over_time(kds_zone_client_connected[1h]))
            * on (%(clusterLabel)s, instance, job) group_left () (max_over_time(up{%(kdsSelector)s}[2m]) == bool 0)
        )
      |||,
    },
    {
      record: "kds:zone_blocked:max15m",
      expr: "max by (%(clusterLabel)s, zone) (max_over_time(kds_zone_client_blocked[15m]))",
    },
    {
      record: "kds:zone_streams:increase15m",
      expr: "sum by (%(clusterLabel)s, zone) (increase(kds_zone_streams_total[15m]))",
    },
    {
      record: "kds:nacks:rate5m",
      expr: "sum by (%(clusterLabel)s, zone, kind) (rate(kds_nacks_total[5m]))",
    },
    {
      record: "kds:rerequests:rate5m",
      expr: "sum by (%(clusterLabel)s, zone, result) (rate(kds_rerequests_total[5m]))",
    },
    {
      record: "kds:withheld_resources:max",
      expr: "max by (%(clusterLabel)s, zone, kind, verdict) (kds_withheld_resources)",
    },
    {
      record: "kds:plugin_call_errors:ratio_rate5m",
      expr: |||
        sum by (%(clusterLabel)s, plugin, method) (rate(kds_plugin_call_errors_total[5m]))
          / sum by (%(clusterLabel)s, plugin, method) (rate(kds_plugin_calls_total[5m]))
      |||,
    },
  ],
  alerts: [
    {
      alert: "KDSZoneDisconnected",
      expr: |||
        avg_over_time(kds:zone_connected:max[5m]) < 0.5
          unless on (%(clusterLabel)s, zone) kds:zone_blocked:max15m == 1
          unless on (%(clusterLabel)s, zone) max_over_time(kds:zone_process_down:max[5m]) == 1
          unless on (%(clusterLabel)s) kds:global_up:max == 0
      |||,
      "for": "2m",
      labels: {
        severity: "critical",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }} has no KDS stream to any global replica",
        description: "Zone {{ $labels.zone }} has had no stream open to any global replica for most of 5 minutes (down, or reconnecting again and again): it gets no new resources. Check the zone's kds_zone_client_connected and its log (the global address, TLS, its token), and the global's log for the zone's refusals. A zone removed on purpose alerts until forgotten: DELETE /api/zones/{{ $labels.zone }} on the global.",
      },
    },
    {
      alert: "KDSZoneCannotReachGlobal",
      expr: |||
        kds_zone_client_connected == 0
          unless on (%(clusterLabel)s, zone) kds:zone_blocked:max15m == 1
          unless on (%(clusterLabel)s) kds:global_up:max == 0
          unless on (%(clusterLabel)s, zone) avg_over_time(kds:zone_connected:max[5m]) < 0.5
      |||,
      "for": "5m",
      labels: {
        severity: "critical",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }} cannot keep a KDS stream to its global",
        description: "The zone control plane {{ $labels.zone }} ({{ $labels.instance }}) has had no stream to a global for 5 minutes: it keeps what it holds and gets nothing new. Its GET /api/zone shows the global it last tried and the last error (connection refused, TLS, unauthenticated). A zone the global knows pages as KDSZoneDisconnected instead.",
      },
    },
    {
      alert: "KDSZoneFlapping",
      expr: "kds:zone_streams:increase15m > 5 unless on (%(clusterLabel)s, zone) kds:zone_blocked:max15m == 1",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }} keeps reconnecting",
        description: "Zone {{ $labels.zone }} opened about {{ $value | printf \"%.0f\" }} KDS streams in 15 minutes: each new stream costs a resync of what changed and delays updates. Look for two zone processes with one name (refusals with reason replaced), a proxy or load balancer cutting idle streams, or a replica that restarts.",
      },
    },
    {
      alert: "KDSZoneBlocked",
      expr: "count by (%(clusterLabel)s) (kds_zone_client_blocked == 1) > 0",
      "for": "1m",
      labels: {
        severity: "critical",
      },
      annotations: {
        summary: "{{ $value }} zones do not sync: their global serves another store",
        description: "The global now serves another store than the one {{ $value }} zones synced from (a replaced or restored database), so they keep what they hold and sync nothing; one alert for them all (kds_zone_client_blocked == 1 names them), and their reconnections and lag do not page. If the global's store was replaced on purpose, accept it on each zone (POST /api/zone/accept-global from the zone's machine, or restart it with --accept-new-global); otherwise restore the global's database.",
      },
    },
    {
      alert: "KDSZoneBehind",
      expr: |||
        max by (%(clusterLabel)s, zone, kind, reason) (kds_zone_behind_resources{reason!="withheld"}) > 0
          unless on (%(clusterLabel)s, zone) kds:zone_blocked:max15m == 1
      |||,
      "for": "10m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }} lacks {{ $value }} {{ $labels.kind }} the global serves ({{ $labels.reason }})",
        description: "For 10 minutes zone {{ $labels.zone }} has not held {{ $value }} {{ $labels.kind }} resources at the version the global serves; reason {{ $labels.reason }}: parked (the zone refused them as invalid; they are not sent again until they change), given_up (the retry policy gave up on the zone's stream), missing (in flight, or refused and being retried). The alert stays until the zone has caught up. kds-host inspect zones names them, with the zone's cause and reason.",
      },
    },
    {
      alert: "KDSNACKStorm",
      expr: "sum by (%(clusterLabel)s, zone) (kds:nacks:rate5m) > 2",
      "for": "10m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }} NACKs {{ $value | humanize }} responses a second",
        description: "For 10 minutes zone {{ $labels.zone }} has refused more than 2 KDS responses a second: far more than retry rounds with backoff send. Look for what it refuses and why (kds-host inspect zones, the causes in kds_rejected_resources_total) and for a retry policy without backoff or a plugin whose fallback is a short fixed delay.",
      },
    },
    {
      alert: "KDSZoneKeepsRejecting",
      expr: "sum by (%(clusterLabel)s, zone, kind) (increase(kds_nacks_total[10m])) > 0",
      "for": "30m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }} has refused {{ $labels.kind }} for 30 minutes",
        description: "Zone {{ $labels.zone }} has NACKed {{ $labels.kind }} in every 10 minutes for the last 30: the resources it refuses do not reach it and retries do not help. kds-host inspect zones names them, with the zone's cause and reason.",
      },
    },
    {
      alert: "KDSRetryGaveUp",
      expr: "sum by (%(clusterLabel)s, zone) (increase(kds_retry_give_ups_total[15m])) > 0",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "The retry policy gave up on zone {{ $labels.zone }}",
        description: "The retry policy gave up on zone {{ $labels.zone }}'s stream: what the zone refused is not sent again until its content changes or the zone reconnects. kds-host inspect zones shows the give-up and its reason; fix what the zone refuses, or the policy's max attempts.",
      },
    },
    {
      alert: "KDSResourcesWithheldForLong",
      expr: "kds:withheld_resources:max > 0",
      "for": "15m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "{{ $value }} {{ $labels.kind }} withheld from zone {{ $labels.zone }} ({{ $labels.verdict }}) for 15 minutes",
        description: "Owner holds have kept {{ $labels.kind }} resources from zone {{ $labels.zone }} for 15 minutes with verdict {{ $labels.verdict }}. WAIT: the zone has not ACKed their owner (is the owner refused?); REJECT: their owner exists nowhere, fix or delete them. GET /api/zones?state=withholding lists them with the owner each waits for.",
      },
    },
    {
      alert: "KDSUnservableResources",
      expr: "max by (%(clusterLabel)s, kind) (kds_unservable_resources) > 0",
      "for": "5m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "{{ $value }} stored {{ $labels.kind }} cannot be served to zones",
        description: "The global stores {{ $value }} {{ $labels.kind }} resources it cannot read or encode for zones: no zone gets them (nor their changes) until they are fixed or deleted. GET /api/unservable lists them with the column and the error; the global logs one ERROR line per resource, generation and column.",
      },
    },
    {
      alert: "KDSReRequestsLimited",
      expr: "sum by (%(clusterLabel)s, zone) (kds:rerequests:rate5m{result=\"limited\"}) > 0",
      "for": "10m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Zone {{ $labels.zone }}'s re-requests are rate-limited",
        description: "For 10 minutes the global has refused some of zone {{ $labels.zone }}'s requests to send again what it refused once the cause cleared (--rerequest-rate, --rerequest-burst): those names wait for the retry timer. Either the zone asks far too often (its log, kds_zone_client_rerequests_total) or the limit is too low for the zone's size.",
      },
    },
    {
      alert: "KDSPluginDown",
      expr: "kds_plugin_up == 0",
      "for": "2m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Plugin {{ $labels.plugin }} on {{ $labels.instance }} is down",
        description: "Plugin {{ $labels.plugin }} has not answered calls for 2 minutes: the built-in retry policy decides in its place and the owner check fails open (everything is sent). kds-host inspect plugins shows its state and last error; the global's log has the plugin's own lines.",
      },
    },
    {
      alert: "KDSPluginRestarting",
      expr: "increase(kds_plugin_restarts_total[15m]) > 0",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Plugin {{ $labels.plugin }} on {{ $labels.instance }} was restarted",
        description: "The host started plugin {{ $labels.plugin }} again (about {{ $value | printf \"%.0f\" }} times in 15 minutes): its process exited or hung. Calls meanwhile went to the built-in policy. kds-host inspect plugins shows the restarts and the last error; the global's log has the plugin's output before it died.",
      },
    },
    {
      alert: "KDSPluginCallsFailing",
      expr: "kds:plugin_call_errors:ratio_rate5m > 0.05",
      "for": "10m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "{{ $value | humanizePercentage }} of {{ $labels.plugin }}'s {{ $labels.method }} calls fail",
        description: "For 10 minutes more than 5% of plugin {{ $labels.plugin }}'s {{ $labels.method }} calls have failed or timed out; the built-in policy answered them instead. kds-host inspect plugins shows the last error (a timeout, a decision outside the host's bounds, a refused call while the plugin was down).",
      },
    },
    {
      alert: "KDSPluginReloadFailed",
      expr: "increase(kds_plugin_reloads_total{result=\"error\"}[15m]) > 0",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "A plugin reload failed on {{ $labels.instance }}",
        description: "A reload (SIGHUP or POST /api/plugins/reload) failed: the plugins loaded before it still run. The answer of the reload and the global's log say why (a checksum that does not match, a bad policy document, a binary that does not start).",
      },
    },
    {
      alert: "KDSOwnerCheckFailingOpen",
      expr: "sum by (%(clusterLabel)s, zone) (increase(kds_owner_check_fail_open_total[10m])) > 0",
      "for": "10m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "The owner check fails open for zone {{ $labels.zone }}",
        description: "For 10 minutes pushes to zone {{ $labels.zone }} have gone unchecked because the owner check failed or timed out (--owner-check-timeout): resources are sent before their owner and the zone refuses them. Check the owner-check plugin (kds-host inspect plugins) and kds_owner_check_call_seconds.",
      },
    },
    {
      alert: "KDSHostDown",
      expr: "up{%(kdsSelector)s} == 0",
      "for": "2m",
      labels: {
        severity: "critical",
      },
      annotations: {
        summary: "kds-host {{ $labels.instance }} cannot be scraped",
        description: "Prometheus has not scraped {{ $labels.instance }} (job {{ $labels.job }}) for 2 minutes: the process is down, or its diagnostics address (--diag-addr) cannot be reached. No other kds-host alert can fire for it meanwhile.",
      },
    },
    {
      alert: "KDSStoreNotReady",
      expr: "kds_store_up == 0",
      "for": "1m",
      labels: {
        severity: "critical",
      },
      annotations: {
        summary: "The store of {{ $labels.instance }} does not answer, or has no room to write",
        description: "{{ $labels.instance }} has not read its store's revision within 2s, or its writes have failed for lack of space, for a minute: /readyz fails and says which, the API answers 503 (507 when out of space) and no write reaches any zone. Check the database (PostgreSQL up, reachable, connections left; its disk, or SQLite's under --data-dir) and the process's log.",
      },
    },
    {
      alert: "KDSStoreListenDown",
      expr: "kds_store_listen_up == 0",
      "for": "2m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "Replica {{ $labels.instance }} has lost its PostgreSQL LISTEN connection",
        description: "Replica {{ $labels.instance }} has not had its LISTEN connection for 2 minutes: it hears other replicas' writes by polling only, so they reach its zones later. It reconnects by itself with backoff; check PostgreSQL (pg_stat_activity, application_name 'kds-host listen') and the network.",
      },
    },
    {
      alert: "KDSStreamsRefused",
      expr: "sum by (%(clusterLabel)s, instance, reason) (increase(kds_stream_refusals_total{reason!=\"replaced\"}[10m])) > 0",
      "for": "5m",
      labels: {
        severity: "warning",
      },
      annotations: {
        summary: "{{ $labels.instance }} refuses KDS streams ({{ $labels.reason }})",
        description: "For 5 minutes {{ $labels.instance }} has refused KDS streams with reason {{ $labels.reason }} (about {{ $value | printf \"%.0f\" }} in 10 minutes): unauthenticated or permission_denied is a zone with a missing, expired or foreign token; limit is --max-zones or --kds-max-unknown-names reached; invalid is a bad node id. The global's log names the zone and the reason.",
      },
    },
  ],
}

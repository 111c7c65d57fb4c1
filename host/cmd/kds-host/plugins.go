package main

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"

	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/policy"
	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
)

// pluginFlags choose the plugins a global runs.
type pluginFlags struct {
	config       string
	paths        []string
	documents    []string
	env          []string
	startTimeout time.Duration
	// retryMaxDelay is the longest retry delay the host accepts from a policy.
	retryMaxDelay time.Duration
}

func addPluginFlags(f *pflag.FlagSet, flags *pluginFlags) {
	f.StringVar(&flags.config, "config", "", "global: YAML file listing the plugins and their policy documents "+
		"(plugins: [{path: ./bin/retry-forcer@sha256:HEX, config: {policy: fixed, delay: 1s}}, {path: builtin}]; "+
		"configFile: FILE instead of config; paths relative to the file). SIGHUP and POST /api/plugins/reload re-read it. "+
		"It wins: with --config, --plugin and --plugin-config are ignored")
	f.StringSliceVar(&flags.paths, "plugin", nil, "global: plugin binary to run, PATH or PATH@sha256:HEX to pin its checksum (repeatable). "+
		"The binary says what it serves (RetryForcer, OwnerCheck or both); what no plugin serves, builtin does (the default for both)")
	f.StringSliceVar(&flags.documents, "plugin-config", nil, "global: NAME=FILE configures plugin NAME (its Describe name, e.g. retry-forcer, "+
		"its binary's file name, or builtin) with the policy document in FILE (repeatable). "+
		"Without --config, SIGHUP and POST /api/plugins/reload re-read these files and restart the --plugin binaries")
	f.StringSliceVar(&flags.env, "plugin-env", nil, "global: NAME of a host environment variable every plugin also sees, with the host's value (repeatable; "+
		"KDS_PLUGIN_ENV=A,B). A plugin sees only PATH, HOME, TMPDIR, these, its --config entry's env: [NAME] and go-plugin's own variables: "+
		"nothing else of the host's environment (not KDS_STORE, not cloud credentials) reaches it. It applies with --config too")
	f.DurationVar(&flags.startTimeout, "plugin-start-timeout", 10*time.Second, "global: how long a plugin may take to start: the go-plugin handshake, then Describe and Configure")
	f.DurationVar(&flags.retryMaxDelay, "retry-max-delay", shared.DefaultMaxDelay, "global: the longest delay the host accepts from a retry policy. "+
		"A decision outside the host's bounds (this delay; a reason over 1 KiB; kinds or hold names the request did not carry) is refused: "+
		"it counts as an error of the plugin (kds-host inspect plugins), a WARN line names the field and its value, and the built-in policy decides instead")
}

// refuseInZone refuses the plugin flags in a zone, which runs no plugin.
func (f *pluginFlags) refuseInZone() error {
	if f.config != "" || len(f.paths) > 0 || len(f.documents) > 0 || len(f.env) > 0 {
		return fmt.Errorf("--config, --plugin, --plugin-config and --plugin-env are global flags; a zone runs no plugin")
	}
	return nil
}

// load reads the plugins to run: --config, or --plugin and --plugin-config. It reads every file
// again each time: a reload applies what it returns.
func (f *pluginFlags) load() (policy.Plugins, error) {
	if f.config != "" {
		return policy.LoadFile(f.config)
	}
	var p policy.Plugins
	for _, v := range f.paths {
		s, err := policy.ParseSpec(v)
		if err != nil {
			return p, fmt.Errorf("--plugin: %w", err)
		}
		p.List = append(p.List, s)
	}
	for _, v := range f.documents {
		name, doc, err := policy.ReadDocumentFlag(v)
		if err != nil {
			return p, fmt.Errorf("--plugin-config: %w", err)
		}
		if _, dup := p.Documents[name]; dup {
			return p, fmt.Errorf("--plugin-config: two documents for plugin %q", name)
		}
		if p.Documents == nil {
			p.Documents = map[string]policy.Document{}
		}
		p.Documents[name] = doc
	}
	return p, nil
}

// start starts the plugin runtime and makes cfg use it (controlplane's UsePlugins). It fails on
// a plugin that cannot be used.
func (f *pluginFlags) start(log hclog.Logger, cfg *controlplane.GlobalConfig) (*policy.Runtime, error) {
	if f.config != "" && (len(f.paths) > 0 || len(f.documents) > 0) {
		log.Warn("--config is given: --plugin and --plugin-config are ignored", "config", f.config)
	}
	if err := launch.CheckEnv(f.env); err != nil {
		return nil, fmt.Errorf("--plugin-env: %w", err)
	}
	if f.retryMaxDelay <= 0 {
		return nil, fmt.Errorf("--retry-max-delay %s: want a positive duration such as 1h", f.retryMaxDelay)
	}
	cfg.RetryBounds.MaxDelay = f.retryMaxDelay
	p, err := f.load()
	if err != nil {
		return nil, err
	}
	o := controlplane.PluginOptions(log)
	o.StartTimeout, o.Env, o.Bounds = f.startTimeout, f.env, cfg.RetryBounds
	// The callers set their own, tighter deadlines; this one bounds every call and probe.
	o.CallTimeout = max(cfg.PolicyTimeout, cfg.OwnerCheckTimeout)
	rt, err := policy.New(policy.Config{Plugins: p, Options: o})
	if err != nil {
		return nil, err
	}
	cfg.UsePlugins(rt)
	return rt, nil
}

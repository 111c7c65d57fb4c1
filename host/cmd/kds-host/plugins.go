package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/plugins"
)

// pluginFlags choose the plugins a global runs.
type pluginFlags struct {
	config       string
	paths        []string
	documents    []string
	startTimeout time.Duration
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
	f.DurationVar(&flags.startTimeout, "plugin-start-timeout", 10*time.Second, "global: how long a plugin may take to start: the go-plugin handshake, then Describe and Configure")
}

// refuseInZone refuses the plugin flags in a zone, which runs no plugin.
func (f *pluginFlags) refuseInZone() error {
	if f.config != "" || len(f.paths) > 0 || len(f.documents) > 0 {
		return fmt.Errorf("--config, --plugin and --plugin-config are global flags; a zone runs no plugin")
	}
	return nil
}

// load reads the plugins to run: --config, or --plugin and --plugin-config. It reads every file
// again each time: a reload applies what it returns.
func (f *pluginFlags) load() (plugins.Plugins, error) {
	if f.config != "" {
		return plugins.LoadFile(f.config)
	}
	var p plugins.Plugins
	for _, v := range f.paths {
		s, err := plugins.ParseSpec(v)
		if err != nil {
			return p, fmt.Errorf("--plugin: %w", err)
		}
		p.List = append(p.List, s)
	}
	for _, v := range f.documents {
		name, doc, err := plugins.ReadDocumentFlag(v)
		if err != nil {
			return p, fmt.Errorf("--plugin-config: %w", err)
		}
		if _, dup := p.Documents[name]; dup {
			return p, fmt.Errorf("--plugin-config: two documents for plugin %q", name)
		}
		if p.Documents == nil {
			p.Documents = map[string]plugins.Document{}
		}
		p.Documents[name] = doc
	}
	return p, nil
}

// start starts the plugin runtime and makes cfg use it: its retry policy (with the built-in one
// as the fallback), its owner check, its metrics. It fails on a plugin that cannot be used.
func (f *pluginFlags) start(log hclog.Logger, cfg *controlplane.GlobalConfig) (*plugins.Runtime, error) {
	if f.config != "" && (len(f.paths) > 0 || len(f.documents) > 0) {
		log.Warn("--config is given: --plugin and --plugin-config are ignored", "config", f.config)
	}
	p, err := f.load()
	if err != nil {
		return nil, err
	}
	rt, err := plugins.New(plugins.Config{
		Plugins: p, Logger: log, StartTimeout: f.startTimeout,
		// The callers set their own, tighter deadlines; this one bounds every call and probe.
		CallTimeout: max(cfg.PolicyTimeout, cfg.OwnerCheckTimeout),
	})
	if err != nil {
		return nil, err
	}
	cfg.RetryPolicy, cfg.Builtin, cfg.OwnerCheck = rt.RetryForcer, rt.Fallback(), rt.OwnerCheck
	cfg.Collectors = append(cfg.Collectors, rt.Collectors()...)
	return rt, nil
}

// pluginsReport is the answer of GET /api/plugins and POST /api/plugins/reload.
type pluginsReport struct {
	Items []plugins.Status `json:"items"`
	Total int              `json:"total"`
	// Config is the --config file a reload reads, if any.
	Config     string                `json:"config,omitempty"`
	LastReload *plugins.ReloadResult `json:"lastReload,omitempty"`
}

// serve mounts GET /api/plugins and POST /api/plugins/reload on the API, and reloads the plugins
// on SIGHUP. The returned func stops the SIGHUP handler and waits for it.
func (f *pluginFlags) serve(ctx context.Context, log hclog.Logger, rt *plugins.Runtime, a *api.Server) (stop func()) {
	report := func() pluginsReport {
		st := rt.Status()
		return pluginsReport{Items: st, Total: len(st), Config: f.config, LastReload: rt.LastReload()}
	}
	a.Handle("GET /api/plugins", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusOK, report())
	}))
	a.Handle("POST /api/plugins/reload", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := f.reload(r.Context(), rt); err != nil {
			api.WriteError(w, &api.Error{Status: http.StatusUnprocessableEntity, Title: "Plugin reload failed",
				Details: err.Error() + " (the running plugins stay)"})
			return
		}
		api.WriteJSON(w, http.StatusOK, report())
	}))

	ctx, cancel := context.WithCancel(ctx)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading the plugins", "config", f.config)
				_ = f.reload(ctx, rt) // the runtime logs the outcome
			}
		}
	})
	return func() {
		signal.Stop(hup)
		cancel()
		wg.Wait()
	}
}

// reload reads the plugin configuration again and swaps the plugins.
func (f *pluginFlags) reload(ctx context.Context, rt *plugins.Runtime) error {
	return rt.Reload(ctx, f.load)
}

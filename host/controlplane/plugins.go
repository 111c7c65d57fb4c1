package controlplane

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/internal/hclogslog"
	"github.com/kds-host/kds-host/policy"
)

// PluginOptions are the plugin runtime's options as kds-host sets them: its records go to log,
// so they read as kds-host's own lines (hclog's text, or JSON with --log-json: the runtime's
// under "<log>.plugin", a plugin's under "<log>.plugin.<binary>"), and its metrics are named
// kds_plugin_*.
func PluginOptions(log hclog.Logger) policy.Options {
	return policy.Options{Logger: slog.New(hclogslog.New(log)), Metrics: policy.Metrics{Namespace: "kds"}}
}

// UsePlugins makes the global use the plugin runtime: the retry policy in force (with the
// built-in policy as the fallback), the owner check in force, and the runtime's metrics.
func (cfg *GlobalConfig) UsePlugins(rt *policy.Runtime) {
	cfg.RetryPolicy, cfg.Builtin, cfg.OwnerCheck = rt.RetryForcer, rt.Fallback(), rt.OwnerCheck
	cfg.OwnerCheckGeneration = rt.Generation
	cfg.Collectors = append(cfg.Collectors, rt.Collectors()...)
}

// PluginsReport is the answer of GET /api/plugins and POST /api/plugins/reload.
type PluginsReport struct {
	Items []policy.Status `json:"items"`
	Total int             `json:"total"`
	// Config is the --config file a reload reads, if any.
	Config     string               `json:"config,omitempty"`
	LastReload *policy.ReloadResult `json:"lastReload,omitempty"`
}

// ServePlugins mounts GET /api/plugins and POST /api/plugins/reload on the global's API, and
// makes Run reload the plugins on SIGHUP until it returns. A reload swaps in what load returns
// (it reads the configuration again each time); configFile is the file it reads, if any, for the
// report. Call it before Run.
func (g *Global) ServePlugins(rt *policy.Runtime, load func() (policy.Plugins, error), configFile string) {
	report := func() PluginsReport {
		st := rt.Status()
		return PluginsReport{Items: st, Total: len(st), Config: configFile, LastReload: rt.LastReload()}
	}
	g.API.Handle("GET /api/plugins", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusOK, report())
	}))
	g.API.Handle("POST /api/plugins/reload", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rt.Reload(r.Context(), load); err != nil {
			api.WriteError(w, &api.Error{Status: http.StatusUnprocessableEntity, Title: "Plugin reload failed",
				Details: err.Error() + " (the running plugins stay)"})
			return
		}
		api.WriteJSON(w, http.StatusOK, report())
	}))
	g.reloads = func(ctx context.Context) {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				g.log.Info("SIGHUP: reloading the plugins", "config", configFile)
				_ = rt.Reload(ctx, load) // the runtime logs the outcome
			}
		}
	}
}

package policy

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/kds-host/kds-host/shared"
	"github.com/kds-host/kds-host/shared/launch"
)

// Options configure a Runtime. The zero value of every field is a default.
type Options struct {
	// Logger receives the runtime's log. Its own records and go-plugin's carry LoggerKey
	// "plugin"; the log lines of a plugin (hclog JSON lines on its stderr) carry
	// "plugin.<binary's file name>". Nil discards them.
	Logger *slog.Logger
	// Metrics name the runtime's Prometheus metrics (Runtime.Collectors).
	Metrics Metrics
	// Env names the host environment variables every plugin sees besides PATH, HOME and
	// TMPDIR, with the host's values (launch.Options.Env); a Spec adds its own. Nothing else
	// of the host's environment reaches a plugin (no database password, no cloud credentials),
	// only these and go-plugin's own variables.
	Env []string
	// CopyDir is where pinned binaries are copied to run from (launch.Options.CopyDir; default
	// os.TempDir()).
	CopyDir string
	// LogRate and LogBurst bound the log lines of each plugin binary that reach Logger:
	// LogRate a second, LogBurst at once (defaults 100 and 200), over all its restarts. The
	// lines over the bound are counted (<namespace>_plugin_log_lines_dropped_total) and
	// summarised in the log at most once per LogSummaryInterval (default 10s), and when the
	// plugin stops.
	LogRate            float64
	LogBurst           int
	LogSummaryInterval time.Duration
	// StartTimeout bounds a plugin's start: the go-plugin handshake, then Describe and Configure
	// (default 10s).
	StartTimeout time.Duration
	// CallTimeout is the deadline of every call to a plugin (default 200ms).
	CallTimeout time.Duration
	// Bounds are what the host accepts of a RetryForcer's Schedule answer (zero fields:
	// shared's defaults). An answer outside them fails the call: it is counted as an error of
	// the plugin that gave it, kept as its last error, and logged at WARN with the field and its
	// value; the caller falls back.
	Bounds shared.Bounds
	// HungAfter is how many calls in a row may miss their deadline before the plugin is taken
	// for hung, killed and replaced (default 3). Health probes count too.
	HungAfter int
	// ProbeInterval is how often an idle plugin is asked to Describe itself, so that a hung
	// plugin is found without traffic (default 1s).
	ProbeInterval time.Duration
	// KillTimeout bounds go-plugin's Kill (a graceful stop, which can hang); past it the
	// process is SIGKILLed (default 2s).
	KillTimeout time.Duration
	// BackoffMin and BackoffMax bound the delay before a plugin is started again: BackoffMin
	// after a plugin that ran for StableAfter exits, doubling while it keeps failing
	// (defaults 100ms, 10s, 10s).
	BackoffMin, BackoffMax, StableAfter time.Duration
}

// Config is what New runs: the plugins, in the full form of kds-host's flags and --config
// file, and the Options. Only Plugins changes later, by Reload.
type Config struct {
	Plugins Plugins
	Options
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.StartTimeout, 10*time.Second)
	def(&o.CallTimeout, 200*time.Millisecond)
	def(&o.ProbeInterval, time.Second)
	def(&o.KillTimeout, 2*time.Second)
	def(&o.BackoffMin, 100*time.Millisecond)
	def(&o.BackoffMax, 10*time.Second)
	def(&o.StableAfter, 10*time.Second)
	def(&o.LogSummaryInterval, 10*time.Second)
	if o.HungAfter <= 0 {
		o.HungAfter = 3
	}
	if o.LogRate <= 0 {
		o.LogRate = 100
	}
	if o.LogBurst <= 0 {
		o.LogBurst = 200
	}
}

// validate says what is wrong with o, naming the field: a negative duration, rate or count
// (zero is the default), bad Metrics, a bad Env name.
func (o *Options) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Options.LogSummaryInterval", o.LogSummaryInterval}, {"Options.StartTimeout", o.StartTimeout},
		{"Options.CallTimeout", o.CallTimeout}, {"Options.ProbeInterval", o.ProbeInterval},
		{"Options.KillTimeout", o.KillTimeout}, {"Options.BackoffMin", o.BackoffMin},
		{"Options.BackoffMax", o.BackoffMax}, {"Options.StableAfter", o.StableAfter},
	} {
		if d.v < 0 {
			return fmt.Errorf("%s %s: want a positive duration, or 0 for the default", d.name, d.v)
		}
	}
	switch {
	case o.LogRate < 0:
		return fmt.Errorf("Options.LogRate %g: want a positive rate, or 0 for the default", o.LogRate)
	case o.LogBurst < 0:
		return fmt.Errorf("Options.LogBurst %d: want a positive count, or 0 for the default", o.LogBurst)
	case o.HungAfter < 0:
		return fmt.Errorf("Options.HungAfter %d: want a positive count, or 0 for the default", o.HungAfter)
	}
	if err := launch.CheckEnv(o.Env); err != nil {
		return fmt.Errorf("Options.Env: %w", err)
	}
	return o.Metrics.validate()
}

// Plugin is a go-plugin binary that serves RetryForcer, OwnerCheck or both: the runtime asks it.
type Plugin struct {
	// Path is the binary, or Builtin to give the in-process retry policy a Config.
	Path string
	// SHA256 pins the binary's checksum, 64 hex digits (sha256sum PATH): the binary is copied
	// to a private folder, hashed as it is copied, refused if it does not match, and run from
	// the copy through go-plugin's SecureConfig, so the process runs exactly the bytes that were
	// hashed. Empty runs whatever is at Path.
	SHA256 string
	// Config is the policy document the plugin's RetryForcer is configured with (for the
	// reference retry-forcer, its YAML: "policy: exponential\n"). Empty keeps the plugin's own
	// default; a plugin that serves only OwnerCheck takes none.
	Config []byte
}

// String is PATH, or PATH@sha256:HEX when the checksum is pinned.
func (p Plugin) String() string {
	if p.SHA256 == "" {
		return p.Path
	}
	return p.Path + checksumSep + p.SHA256
}

// ParsePlugin reads PATH or PATH@sha256:HEX.
func ParsePlugin(spec string) (Plugin, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return Plugin{}, err
	}
	if s.PinFolder {
		return Plugin{}, fmt.Errorf("plugin %q: a folder pin is kds-host's; want PATH or PATH@sha256:HEX", spec)
	}
	return Plugin{Path: s.Path, SHA256: hex.EncodeToString(s.SHA256)}, nil
}

// spec is p as a Spec; at names p in errors and in the document's Source.
func (p Plugin) spec(at string) (Spec, error) {
	if p.Path == "" {
		return Spec{}, fmt.Errorf("%s.Path is empty: want a plugin binary, or %s", at, Builtin)
	}
	s := Spec{Path: p.Path}
	if p.SHA256 != "" {
		if p.Path == Builtin {
			return Spec{}, fmt.Errorf("%s.SHA256: the built-in policies take no checksum", at)
		}
		sum, err := hex.DecodeString(p.SHA256)
		if err != nil || len(sum) != 32 {
			return Spec{}, fmt.Errorf("%s.SHA256 %q: want 64 hex digits (sha256sum %s)", at, p.SHA256, p.Path)
		}
		s.SHA256 = sum
	}
	if len(p.Config) > 0 {
		s.Document = &Document{Source: at + ".Config", Data: p.Config}
	}
	return s, nil
}

// Open starts plugins, checks and configures them, and supervises them; what no plugin serves,
// the built-in policies answer. It fails, with everything it started stopped, on an option or a
// plugin it cannot use, with an error that names it ("plugins[1].SHA256 ...", "Options.CallTimeout
// ...", a wrong checksum as a *launch.ChecksumError), or when ctx ends first. ctx bounds the
// start only; Close stops the plugins.
func Open(ctx context.Context, plugins []Plugin, o Options) (*Runtime, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("policy.Open: %w", err)
	}
	var p Plugins
	for i, pl := range plugins {
		s, err := pl.spec(fmt.Sprintf("plugins[%d]", i))
		if err != nil {
			return nil, fmt.Errorf("policy.Open: %w", err)
		}
		p.List = append(p.List, s)
	}
	rt, err := start(ctx, Config{Plugins: p, Options: o})
	if err != nil {
		return nil, fmt.Errorf("policy.Open: %w", err)
	}
	return rt, nil
}

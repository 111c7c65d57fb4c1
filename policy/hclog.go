package policy

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// LoggerKey is the attribute that names where a record of the runtime comes from, as a logger's
// name: "plugin" for the runtime and go-plugin, "plugin.<binary's file name>" for a plugin's own
// log lines. A handler may read it as a sub-logger's name (kds-host's hclog log does).
const LoggerKey = "logger"

// runtimeName is the LoggerKey of the runtime's own records.
const runtimeName = "plugin"

// goPluginLogger is the hclog.Logger that go-plugin and shared/launch get for one plugin binary:
// it writes slog records to the runtime's logger. go-plugin's own messages pass; the plugin's log
// lines, which go-plugin logs through Named(binary's file name), go through the binary's logRelay.
// A line the logger would not emit at its level costs nothing. StandardLogger and StandardWriter
// are not bounded: go-plugin uses them only for yamux, with a gRPC broker multiplex this runtime
// does not enable.
type goPluginLogger struct {
	base    *slog.Logger // the runtime's Options.Logger
	log     *slog.Logger // base with this logger's name and implied args
	name    string
	implied []any
	relay   *logRelay
	limited bool // false: go-plugin's own messages, which pass
}

// newGoPluginLogger is the logger of relay's plugin binary.
func newGoPluginLogger(base *slog.Logger, relay *logRelay) *goPluginLogger {
	return &goPluginLogger{base: base, log: base.With(LoggerKey, runtimeName), name: runtimeName, relay: relay}
}

// slogLevel is the slog level of an hclog level; Trace is below slog.LevelDebug.
func slogLevel(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (l *goPluginLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off || !l.enabled(level) {
		return
	}
	if l.limited {
		if !l.relay.admit() {
			return
		}
		args = withoutRelayTimestamp(args)
	}
	l.log.LogAttrs(context.Background(), slogLevel(level), msg, attrs(args)...)
}

// attrs turns hclog's key and value pairs into attributes: a key that is no string is formatted
// with %s, and a value without a key gets hclog's MissingKey.
func attrs(args []any) []slog.Attr {
	out := make([]slog.Attr, 0, (len(args)+1)/2)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			out = append(out, slog.Any(hclog.MissingKey, args[i]))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = fmt.Sprintf("%s", args[i])
		}
		out = append(out, slog.Any(key, args[i+1]))
	}
	return out
}

// withoutRelayTimestamp drops the field go-plugin adds last to every JSON log line of a plugin
// it relays: "timestamp", the line's @timestamp (year 1 when it had none). The host's record
// carries its own time, so the field would only say it twice. A "timestamp" field of the
// plugin's own comes earlier and stays.
func withoutRelayTimestamp(args []any) []any {
	if n := len(args); n >= 2 && args[n-2] == "timestamp" {
		return args[:n-2]
	}
	return args
}

func (l *goPluginLogger) enabled(level hclog.Level) bool {
	return l.log.Enabled(context.Background(), slogLevel(level))
}

func (l *goPluginLogger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l *goPluginLogger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l *goPluginLogger) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l *goPluginLogger) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *goPluginLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *goPluginLogger) IsTrace() bool { return l.enabled(hclog.Trace) }
func (l *goPluginLogger) IsDebug() bool { return l.enabled(hclog.Debug) }
func (l *goPluginLogger) IsInfo() bool  { return l.enabled(hclog.Info) }
func (l *goPluginLogger) IsWarn() bool  { return l.enabled(hclog.Warn) }
func (l *goPluginLogger) IsError() bool { return l.enabled(hclog.Error) }

// GetLevel is the lowest level the runtime's logger emits; SetLevel changes nothing, the level
// being the host's.
func (l *goPluginLogger) GetLevel() hclog.Level {
	for _, level := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if l.enabled(level) {
			return level
		}
	}
	return hclog.Off
}

func (l *goPluginLogger) SetLevel(hclog.Level) {}

func (l *goPluginLogger) ImpliedArgs() []any { return l.implied }
func (l *goPluginLogger) Name() string       { return l.name }

// Named and ResetNamed are the plugin's own lines: they are bounded by the relay.
func (l *goPluginLogger) Named(name string) hclog.Logger {
	return l.renamed(l.name + "." + name)
}

func (l *goPluginLogger) ResetNamed(name string) hclog.Logger { return l.renamed(name) }

func (l *goPluginLogger) renamed(name string) *goPluginLogger {
	return &goPluginLogger{base: l.base, log: l.base.With(LoggerKey, name).With(anys(attrs(l.implied))...),
		name: name, implied: l.implied, relay: l.relay, limited: true}
}

func (l *goPluginLogger) With(args ...any) hclog.Logger {
	return &goPluginLogger{base: l.base, log: l.log.With(anys(attrs(args))...), name: l.name,
		implied: slices.Concat(l.implied, args), relay: l.relay, limited: l.limited}
}

func anys(as []slog.Attr) []any {
	out := make([]any, len(as))
	for i, a := range as {
		out[i] = a
	}
	return out
}

func (l *goPluginLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(l.StandardWriter(opts), "", 0)
}

// StandardWriter logs each write as a line at opts.ForceLevel (default Info).
func (l *goPluginLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	level := hclog.Info
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = opts.ForceLevel
	}
	return lineWriter{l, level}
}

type lineWriter struct {
	log   *goPluginLogger
	level hclog.Level
}

func (w lineWriter) Write(p []byte) (int, error) {
	w.log.Log(w.level, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

var _ hclog.Logger = (*goPluginLogger)(nil)

// Package hclogslog is a slog.Handler that writes to an hclog.Logger, so that a library that
// logs through slog writes into a program's hclog log in that log's own format.
//
// A record's level maps to hclog's: below slog.LevelDebug is Trace, then Debug, Info, Warn and
// Error. An attribute keyed NameKey names a sub-logger (hclog's Named) instead of being a field.
// A group prefixes its attributes' keys ("group.key"). hclog stamps the time.
package hclogslog

import (
	"context"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// NameKey is the key of an attribute that names a sub-logger: "logger", as package policy
// names its records (policy.LoggerKey).
const NameKey = "logger"

// New returns a handler that writes to log.
func New(log hclog.Logger) slog.Handler { return &handler{log: log} }

type handler struct {
	log    hclog.Logger
	prefix string // the open groups, "a.b.", before the keys of what is added later
}

func (h *handler) Enabled(_ context.Context, level slog.Level) bool {
	switch Level(level) {
	case hclog.Trace:
		return h.log.IsTrace()
	case hclog.Debug:
		return h.log.IsDebug()
	case hclog.Info:
		return h.log.IsInfo()
	case hclog.Warn:
		return h.log.IsWarn()
	}
	return h.log.IsError()
}

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	log, args := h.log, make([]any, 0, 2*r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		if name, ok := h.name(a); ok {
			log = log.Named(name)
			return true
		}
		args = appendAttr(args, h.prefix, a)
		return true
	})
	log.Log(Level(r.Level), r.Message, args...)
	return nil
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	log, args := h.log, []any(nil)
	for _, a := range attrs {
		if name, ok := h.name(a); ok {
			log = log.Named(name)
			continue
		}
		args = appendAttr(args, h.prefix, a)
	}
	if len(args) > 0 {
		log = log.With(args...)
	}
	return &handler{log: log, prefix: h.prefix}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{log: h.log, prefix: h.prefix + name + "."}
}

// name returns the sub-logger a names, if it names one.
func (h *handler) name(a slog.Attr) (string, bool) {
	if h.prefix != "" || a.Key != NameKey || a.Value.Kind() != slog.KindString {
		return "", false
	}
	return a.Value.String(), true
}

// appendAttr appends a as hclog's key and value pairs: a group's attributes each under
// "group.key", nothing for an empty attribute.
func appendAttr(args []any, prefix string, a slog.Attr) []any {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return args
	}
	if a.Value.Kind() == slog.KindGroup {
		if a.Key != "" {
			prefix += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			args = appendAttr(args, prefix, g)
		}
		return args
	}
	return append(args, prefix+a.Key, a.Value.Any())
}

// Level is hclog's level for a slog level.
func Level(l slog.Level) hclog.Level {
	switch {
	case l < slog.LevelDebug:
		return hclog.Trace
	case l < slog.LevelInfo:
		return hclog.Debug
	case l < slog.LevelWarn:
		return hclog.Info
	case l < slog.LevelError:
		return hclog.Warn
	}
	return hclog.Error
}

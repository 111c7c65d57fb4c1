package hclogslog_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/internal/hclogslog"
	"github.com/kds-host/kds-host/policy"
)

// TestALineLoggedThroughSlogReadsAsHclogsOwn: each line is logged once straight to hclog and once
// through slog and the handler, in hclog's text and JSON formats; the two logs are the same.
func TestALineLoggedThroughSlogReadsAsHclogsOwn(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		direct func(hclog.Logger)
		slog   func(*slog.Logger)
	}{
		{"fields of each kind",
			func(l hclog.Logger) {
				l.Info("loaded", "s", "x y", "n", 3, "u", uint64(7), "d", 2*time.Second, "f", 1.5, "b", true, "err", boom, "list", []string{"a", "b"})
			},
			func(l *slog.Logger) {
				l.Info("loaded", "s", "x y", "n", 3, "u", uint64(7), "d", 2*time.Second, "f", 1.5, "b", true, "err", boom, "list", []string{"a", "b"})
			}},
		{"a name", func(l hclog.Logger) { l.Named("plugin").Warn("down", "pid", 12) },
			func(l *slog.Logger) { l.With(hclogslog.NameKey, "plugin").Warn("down", "pid", 12) }},
		{"names in turn, or dotted", func(l hclog.Logger) { l.Named("plugin").Named("flood").Info("a"); l.Named("plugin.flood").Info("b") },
			func(l *slog.Logger) {
				l.With(hclogslog.NameKey, "plugin").With(hclogslog.NameKey, "flood").Info("a")
				l.With(hclogslog.NameKey, "plugin.flood").Info("b")
			}},
		{"a name on the record", func(l hclog.Logger) { l.Named("plugin").Info("m", "k", "v") },
			func(l *slog.Logger) { l.Info("m", hclogslog.NameKey, "plugin", "k", "v") }},
		{"implied fields", func(l hclog.Logger) { l.With("k", 1).Named("plugin").Info("m", "j", 2) },
			func(l *slog.Logger) { l.With("k", 1).With(hclogslog.NameKey, "plugin").Info("m", "j", 2) }},
		{"groups", func(l hclog.Logger) { l.Info("m", "g.k", "v", "g.h.k", 1, "top", 2) },
			func(l *slog.Logger) { l.Info("m", slog.Group("g", "k", "v", slog.Group("h", "k", 1)), "top", 2) }},
		{"a group's name key is a field", func(l hclog.Logger) { l.With("g.logger", "x").Info("m", "g.k", 1) },
			func(l *slog.Logger) { l.WithGroup("g").With(hclogslog.NameKey, "x").Info("m", "k", 1) }},
		{"levels", func(l hclog.Logger) { l.Trace("t"); l.Debug("d"); l.Info("i"); l.Warn("w"); l.Error("e") },
			func(l *slog.Logger) {
				ctx := context.Background()
				l.Log(ctx, slog.LevelDebug-4, "t")
				l.Debug("d")
				l.Info("i")
				l.Warn("w")
				l.Error("e")
				l.Log(ctx, slog.LevelError+4, "e")
			}},
	} {
		for _, json := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: ", text", true: ", JSON"}[json], func(t *testing.T) {
				g := NewWithT(t)
				var direct, via bytes.Buffer
				opts := func(out *bytes.Buffer) *hclog.LoggerOptions {
					return &hclog.LoggerOptions{Name: "kds-host", Level: hclog.Trace, Output: out, JSONFormat: json, DisableTime: true}
				}
				tc.direct(hclog.New(opts(&direct)))
				tc.slog(slog.New(hclogslog.New(hclog.New(opts(&via)))))
				if tc.name == "levels" {
					hclog.New(opts(&direct)).Error("e") // slog's ERROR+4 is hclog's Error
				}
				g.Expect(via.String()).NotTo(BeEmpty())
				g.Expect(via.String()).To(Equal(direct.String()))
			})
		}
	}
}

func TestAHandlerIsEnabledAtItsLoggersLevel(t *testing.T) {
	g := NewWithT(t)
	var out bytes.Buffer
	l := slog.New(hclogslog.New(hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &out})))
	ctx := context.Background()
	for level, want := range map[slog.Level]bool{slog.LevelDebug - 4: false, slog.LevelDebug: false, slog.LevelInfo: false,
		slog.LevelWarn: true, slog.LevelError: true} {
		g.Expect(l.Enabled(ctx, level)).To(Equal(want), "%s", level)
	}
	l.Info("quiet")
	g.Expect(out.String()).To(BeEmpty())
}

// The plugin runtime names its records with the key this handler reads as a name.
func TestTheNameKeyIsThePolicyPackages(t *testing.T) {
	NewWithT(t).Expect(hclogslog.NameKey).To(Equal(policy.LoggerKey))
}

// Package conformance checks that a binary is a correct kds-host plugin: it starts the binary
// with the host's own launcher (shared/launch), runs one gomega check for each rule a plugin must
// keep, and reports every check as passed, failed or skipped, with the reason.
//
// Plugin authors run it as `kds-host plugin verify PATH` or as
// `go test ./shared/conformance -args -plugin PATH`; both call Run.
package conformance

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/shared"
)

// The checks, by name. A report lists the common checks, then those of each kind the plugin
// serves, then CheckKill.
const (
	CheckHandshake          = "handshake"
	CheckVersionNegotiation = "version-negotiation"
	CheckDescribe           = "describe"

	CheckRetryConfigure          = "retry-forcer/configure"
	CheckRetryConfigureMalformed = "retry-forcer/configure-malformed"
	CheckRetryScheduleBounds     = "retry-forcer/schedule-bounds"
	CheckRetryHostBounds         = "retry-forcer/host-bounds"
	CheckRetryFloor              = "retry-forcer/floor"
	CheckRetryResetAfterACK      = "retry-forcer/reset-after-ack"
	CheckRetryGiveUp             = "retry-forcer/give-up"
	CheckRetryEmptyInput         = "retry-forcer/empty-input"
	CheckRetryBadInput           = "retry-forcer/bad-input"
	CheckRetryLargeInput         = "retry-forcer/large-input"
	CheckRetryConcurrency        = "retry-forcer/concurrency"
	CheckRetryLatency            = "retry-forcer/latency"

	CheckOwnerZoneIndependent = "owner-check/zone-independent"
	CheckOwnerVerdictTable    = "owner-check/verdict-table"
	CheckOwnerBatch           = "owner-check/batch-10000"
	CheckOwnerEmptyInput      = "owner-check/empty-input"
	CheckOwnerBadInput        = "owner-check/bad-input"
	CheckOwnerConcurrency     = "owner-check/concurrency"
	CheckOwnerLatency         = "owner-check/latency"

	CheckKill = "kill"
)

// Plugin kinds as a report names them.
const (
	KindRetryForcer = "RetryForcer"
	KindOwnerCheck  = "OwnerCheck"
)

// Limits that every plugin is held to.
const (
	// MaxP99Latency is the largest p99 latency of a call that the latency checks accept.
	MaxP99Latency = 50 * time.Millisecond
	// MaxExitAfterKill is how soon the plugin process, and every process it started, must be
	// gone after the host kills it.
	MaxExitAfterKill = 2 * time.Second
	// LargeInput is the number of names in the large-input and batch checks.
	LargeInput = 10_000
	// Concurrency is the number of calls in flight at once in the concurrency checks.
	Concurrency = 100
)

// Options says which plugin to check and how. Only Path is required.
type Options struct {
	// Path is the plugin binary.
	Path string
	// Config is the RetryForcer policy document the checks run under. Empty: the plugin's own
	// sample_config (from Describe).
	Config []byte
	// GiveUpConfig is a RetryForcer policy document that makes the plugin give up after a few
	// rounds. Empty: the suite takes Config (or the sample_config), and when it is a YAML or
	// JSON mapping sets maxAttempts: 3 in it.
	GiveUpConfig []byte
	// Bounds are the host's bounds the answers are held to (kds-host --retry-max-delay; zero
	// fields: shared's defaults, which a host has unless told otherwise).
	Bounds shared.Bounds
	// Logger receives go-plugin's log and the plugin's own log lines; nil discards them.
	Logger hclog.Logger
	// CallTimeout bounds every call to the plugin. Zero means 2s.
	CallTimeout time.Duration
	// StartTimeout bounds the plugin's start and handshake. Zero means 5s.
	StartTimeout time.Duration
	// Budget bounds the run: a check that has not started by then fails as not run. The kill
	// check runs regardless, so that no process is left behind. Zero means 20s.
	Budget time.Duration
}

func (o Options) withDefaults() Options {
	if o.CallTimeout <= 0 {
		o.CallTimeout = 2 * time.Second
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 5 * time.Second
	}
	if o.Budget <= 0 {
		o.Budget = 20 * time.Second
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	o.Bounds = o.Bounds.WithDefaults()
	return o
}

// Report is the outcome of a run: what the plugin is, and every check in the order it ran.
type Report struct {
	// Plugin is the path of the binary.
	Plugin string
	// Name and Version are what the plugin's Describe said, when it answered.
	Name, Version string
	// Kinds are the plugin kinds the binary serves (KindRetryForcer, KindOwnerCheck).
	Kinds    []string
	Checks   []CheckResult
	Duration time.Duration
}

// CheckResult is one check. A check that neither passed nor was skipped failed; Detail says why.
type CheckResult struct {
	Name string
	// Summary says in one line what the check holds the plugin to.
	Summary string
	Passed  bool
	Skipped bool
	// NotRun marks a failed check that could not run: the plugin did not start, or hung or
	// died in an earlier check. Detail says which.
	NotRun bool
	// Detail is why the check failed or was skipped, or what it measured when it passed.
	Detail   string
	Duration time.Duration
}

// Failed reports whether the check neither passed nor was skipped.
func (c CheckResult) Failed() bool { return !c.Passed && !c.Skipped }

// Passed reports whether the run checked something and no check failed.
func (r Report) Passed() bool {
	return len(r.Checks) > 0 && len(r.Failed()) == 0
}

// Failed returns the checks that failed, in order.
func (r Report) Failed() []CheckResult {
	var out []CheckResult
	for _, c := range r.Checks {
		if c.Failed() {
			out = append(out, c)
		}
	}
	return out
}

// Check returns the check called name.
func (r Report) Check(name string) (CheckResult, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return CheckResult{}, false
}

// Err is nil when the report passed, and otherwise says how many checks failed and which.
func (r Report) Err() error {
	if r.Passed() {
		return nil
	}
	failed := r.Failed()
	if len(failed) == 0 {
		return fmt.Errorf("%s: no check ran", r.Plugin)
	}
	var names []string
	notRun := 0
	for _, c := range failed {
		if c.NotRun {
			notRun++
		} else {
			names = append(names, c.Name)
		}
	}
	msg := fmt.Sprintf("%d of %d checks could not run", notRun, len(r.Checks))
	if len(names) > 0 {
		msg = fmt.Sprintf("%d of %d checks failed: %s", len(names), len(r.Checks), strings.Join(names, ", "))
		if notRun > 0 {
			msg += fmt.Sprintf("; %d more could not run", notRun)
		}
	}
	return errors.New(msg)
}

// Write prints the report for a person: a line per check, ✓ passed, ✗ failed, · not run,
// - skipped, with the detail indented below it, and a summary.
func (r Report) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Plugin %s\n", r.Plugin)
	if r.Name != "" || len(r.Kinds) > 0 {
		fmt.Fprintf(&b, "  %s %s, serves %s\n", orDash(r.Name), orDash(r.Version), orDash(strings.Join(r.Kinds, " and ")))
	}
	b.WriteString("\n")
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	var passed, failed, skipped, notRun int
	for _, c := range r.Checks {
		mark := "✗"
		switch {
		case c.Passed:
			mark, passed = "✓", passed+1
		case c.Skipped:
			mark, skipped = "-", skipped+1
		case c.NotRun:
			mark, notRun = "·", notRun+1
		default:
			failed++
		}
		fmt.Fprintf(&b, "%s %-*s  %s (%s)\n", mark, width, c.Name, c.Summary, round(c.Duration))
		if c.Detail != "" {
			prefix := "    "
			switch {
			case c.Skipped:
				prefix = "    skipped: "
			case c.NotRun:
				prefix = "    not run: "
			}
			for i, line := range strings.Split(strings.TrimRight(c.Detail, "\n"), "\n") {
				if i == 1 {
					prefix = strings.Repeat(" ", len(prefix))
				}
				fmt.Fprintf(&b, "%s%s\n", prefix, line)
			}
		}
	}
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "\n%s: %d checks, %d passed, %d failed, %d not run, %d skipped, in %s\n",
		verdict, len(r.Checks), passed, failed, notRun, skipped, round(r.Duration))
	_, err := io.WriteString(w, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// round shortens a duration for a person: 1.234s, 12.3ms, 456µs.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

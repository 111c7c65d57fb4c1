package retrypolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// DefaultSampleConfig is a policy document for the default policy, with every field it accepts.
const DefaultSampleConfig = `# kds-host retry-forcer policy document (YAML or JSON).
policy: exponential   # exponential | fixed | decorrelated
base: 100ms           # first delay (exponential, decorrelated)
factor: 2             # growth per round, >= 1 (exponential)
max: 30s              # largest delay (exponential, decorrelated)
min: 1ms              # smallest delay with full jitter, in (0, base] (exponential)
jitter: full          # full | none (exponential)
maxAttempts: 0        # rounds before giving up; 0 = unlimited (every policy)
# delay: 1s           # the delay of every round (fixed only)
# By the client's cause of each rejection (every policy; these are the defaults):
# transientMax: 2s    # TRANSIENT (admission not ready): never wait longer; the client asks again itself
# ownerWait: 30s      # MISSING_OWNER only: the slow safety net; the owner's ACK resends at once
# invalidAttempts: 3  # INVALID: sends of the same content before it is parked until it changes
`

// Config is a parsed policy document with every default filled in. Fields that do not apply to
// Policy must be zero. Build one with Default or Parse; the zero Config is not valid.
type Config struct {
	// Policy is Exponential, Fixed or Decorrelated.
	Policy string
	// Base is the first delay (exponential, decorrelated).
	Base time.Duration
	// Factor is the exponential growth per round, >= 1.
	Factor float64
	// Max is the largest delay (exponential, decorrelated), >= Base.
	Max time.Duration
	// Min is the smallest delay with full jitter (exponential), in (0, Base].
	Min time.Duration
	// Jitter is JitterFull or JitterNone (exponential).
	Jitter string
	// Delay is the delay of every round (fixed).
	Delay time.Duration
	// MaxAttempts is the number of rounds before giving up; 0 is unlimited.
	MaxAttempts uint32

	// By the client's cause of each rejection, for every policy (zero: the default).
	// TransientMax caps the delay while every name to resend is TRANSIENT (default 2s).
	TransientMax time.Duration
	// OwnerWait is the delay while every name to resend waits for its owner (MISSING_OWNER),
	// capped at the policy's max (default 30s).
	OwnerWait time.Duration
	// InvalidAttempts is how often an INVALID name is sent at one version before it is parked
	// (put in hold) until its content changes (default 3).
	InvalidAttempts uint32
}

// Defaults of the cause fields.
const (
	DefaultTransientMax    = 2 * time.Second
	DefaultOwnerWait       = 30 * time.Second
	DefaultInvalidAttempts = 3
)

func (c Config) transientMax() time.Duration {
	if c.TransientMax > 0 {
		return c.TransientMax
	}
	return DefaultTransientMax
}

func (c Config) ownerWait() time.Duration {
	if c.OwnerWait > 0 {
		return c.OwnerWait
	}
	return DefaultOwnerWait
}

func (c Config) invalidAttempts() uint32 {
	if c.InvalidAttempts > 0 {
		return c.InvalidAttempts
	}
	return DefaultInvalidAttempts
}

// Default is the default policy: exponential, base 100ms, factor 2, max 30s, min 1ms, full
// jitter, unlimited attempts.
func Default() Config { return defaults(Exponential) }

// defaults returns the default Config of a known policy.
func defaults(policy string) Config {
	var c Config
	switch policy {
	case Fixed:
		c = Config{Policy: Fixed, Delay: time.Second}
	case Decorrelated:
		c = Config{Policy: Decorrelated, Base: 100 * time.Millisecond, Max: 30 * time.Second}
	default:
		c = Config{Policy: Exponential, Base: 100 * time.Millisecond, Factor: 2,
			Max: 30 * time.Second, Min: time.Millisecond, Jitter: JitterFull}
	}
	return c
}

// FieldError is what is wrong with one field of a policy document. Field is the document's
// spelling ("base", "maxAttempts"), or "document" when the document as a whole is wrong.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// The document's fields, in the order they are checked and reported.
const (
	fPolicy      = "policy"
	fBase        = "base"
	fFactor      = "factor"
	fMax         = "max"
	fMin         = "min"
	fJitter      = "jitter"
	fDelay       = "delay"
	fMaxAttempts = "maxAttempts"

	fTransientMax    = "transientMax"
	fOwnerWait       = "ownerWait"
	fInvalidAttempts = "invalidAttempts"
)

var fieldOrder = []string{fPolicy, fBase, fFactor, fMax, fMin, fJitter, fDelay, fMaxAttempts, fTransientMax, fOwnerWait, fInvalidAttempts}

var policyNames = []string{Exponential, Fixed, Decorrelated}

// appliesTo lists, for each field other than policy and maxAttempts (which apply to every
// policy), the policies that use it.
var appliesTo = map[string][]string{
	fBase:   {Exponential, Decorrelated},
	fFactor: {Exponential},
	fMax:    {Exponential, Decorrelated},
	fMin:    {Exponential},
	fJitter: {Exponential},
	fDelay:  {Fixed},
}

func applies(field, policy string) bool {
	p, ok := appliesTo[field]
	return !ok || slices.Contains(p, policy)
}

func notApplicable(field, policy string) *FieldError {
	return fieldErr(field, "does not apply to policy %s (only to %s)", policy, strings.Join(appliesTo[field], ", "))
}

// Parse reads a policy document (YAML or JSON, one flat mapping). Fields left out take the
// chosen policy's defaults; an empty document is Default(). Unknown fields, fields that do not
// apply to the chosen policy and bad values are errors; every error is a *FieldError naming the
// field.
func Parse(doc []byte) (Config, error) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return Default(), nil
	}
	// Strict: a key given twice is an error (and so, below, is an unknown key).
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
		return Config{}, fieldErr("document", "not valid YAML or JSON: %s", strings.Join(strings.Fields(msg), " "))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(js, &raw); err != nil {
		return Config{}, fieldErr("document", "must be a flat mapping of fields (e.g. policy: exponential), got %s", abbreviate(js))
	}
	for _, k := range sortedKeys(raw) {
		if !slices.Contains(fieldOrder, k) {
			return Config{}, fieldErr(k, "unknown field (known: %s)", strings.Join(fieldOrder, ", "))
		}
	}

	policy := Exponential
	if v, ok := raw[fPolicy]; ok {
		s, err := stringValue(fPolicy, v)
		if err != nil {
			return Config{}, err
		}
		if !slices.Contains(policyNames, s) {
			return Config{}, unknownPolicy(s)
		}
		policy = s
	}
	cfg := defaults(policy)

	for _, field := range fieldOrder[1:] {
		v, ok := raw[field]
		if !ok {
			continue
		}
		if !applies(field, policy) {
			return Config{}, notApplicable(field, policy)
		}
		var err error
		switch field {
		case fBase:
			cfg.Base, err = durationValue(field, v)
		case fMax:
			cfg.Max, err = durationValue(field, v)
		case fMin:
			cfg.Min, err = durationValue(field, v)
		case fDelay:
			cfg.Delay, err = durationValue(field, v)
		case fFactor:
			cfg.Factor, err = numberValue(field, v)
		case fJitter:
			cfg.Jitter, err = stringValue(field, v)
		case fMaxAttempts:
			cfg.MaxAttempts, err = attemptsValue(field, v)
		case fTransientMax:
			cfg.TransientMax, err = durationValue(field, v)
		case fOwnerWait:
			cfg.OwnerWait, err = durationValue(field, v)
		case fInvalidAttempts:
			cfg.InvalidAttempts, err = attemptsValue(field, v)
			if err == nil && cfg.InvalidAttempts == 0 {
				err = fieldErr(field, "must be at least 1, got 0")
			}
		}
		if err != nil {
			return Config{}, err
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks c: a known policy, values in range, and zero values in the fields that do not
// apply to the policy. The error is a *FieldError naming the first bad field.
func (c Config) Validate() error {
	if !slices.Contains(policyNames, c.Policy) {
		return unknownPolicy(c.Policy)
	}
	set := map[string]bool{
		fBase: c.Base != 0, fFactor: c.Factor != 0, fMax: c.Max != 0, fMin: c.Min != 0,
		fJitter: c.Jitter != "", fDelay: c.Delay != 0,
	}
	for _, field := range fieldOrder {
		if set[field] && !applies(field, c.Policy) {
			return notApplicable(field, c.Policy)
		}
	}
	if c.TransientMax < 0 {
		return fieldErr(fTransientMax, "must be > 0, got %s", c.TransientMax)
	}
	if c.OwnerWait < 0 {
		return fieldErr(fOwnerWait, "must be > 0, got %s", c.OwnerWait)
	}
	switch c.Policy {
	case Exponential:
		if c.Base <= 0 {
			return fieldErr(fBase, "must be > 0, got %s", c.Base)
		}
		if math.IsNaN(c.Factor) || math.IsInf(c.Factor, 0) || c.Factor < 1 {
			return fieldErr(fFactor, "must be >= 1, got %s", formatFactor(c.Factor))
		}
		if c.Max < c.Base {
			return fieldErr(fMax, "must be >= base (%s), got %s", c.Base, c.Max)
		}
		if c.Min <= 0 {
			return fieldErr(fMin, "must be > 0, got %s", c.Min)
		}
		if c.Min > c.Base {
			return fieldErr(fMin, "must be <= base (%s), got %s", c.Base, c.Min)
		}
		if c.Jitter != JitterFull && c.Jitter != JitterNone {
			return fieldErr(fJitter, "unknown jitter %q (%s, %s)", c.Jitter, JitterFull, JitterNone)
		}
	case Decorrelated:
		if c.Base <= 0 {
			return fieldErr(fBase, "must be > 0, got %s", c.Base)
		}
		if c.Max < c.Base {
			return fieldErr(fMax, "must be >= base (%s), got %s", c.Base, c.Max)
		}
	case Fixed:
		if c.Delay <= 0 {
			return fieldErr(fDelay, "must be > 0, got %s", c.Delay)
		}
	}
	return nil
}

func unknownPolicy(name string) *FieldError {
	return fieldErr(fPolicy, "unknown policy %q (%s)", name, strings.Join(policyNames, ", "))
}

// abbreviate shortens a JSON value for an error message.
func abbreviate(js []byte) string {
	const limit = 40
	s := strings.TrimSpace(string(js))
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// decode turns one field's JSON value into a string, a float64, or nil (an empty YAML value).
func decode(field string, v json.RawMessage) (any, error) {
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return nil, fieldErr(field, "bad value %s: %v", v, err)
	}
	if x == nil {
		return nil, fieldErr(field, "has no value; give one or leave the field out")
	}
	return x, nil
}

func stringValue(field string, v json.RawMessage) (string, error) {
	x, err := decode(field, v)
	if err != nil {
		return "", err
	}
	s, ok := x.(string)
	if !ok {
		return "", fieldErr(field, "must be a string, got %s", v)
	}
	return s, nil
}

func durationValue(field string, v json.RawMessage) (time.Duration, error) {
	x, err := decode(field, v)
	if err != nil {
		return 0, err
	}
	s, ok := x.(string)
	if !ok {
		return 0, fieldErr(field, "%s is not a duration (give a unit, e.g. 100ms, 2s, 1m)", v)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fieldErr(field, "%q is not a duration (e.g. 100ms, 2s, 1m)", s)
	}
	return d, nil
}

func numberValue(field string, v json.RawMessage) (float64, error) {
	x, err := decode(field, v)
	if err != nil {
		return 0, err
	}
	f, ok := x.(float64)
	if !ok {
		return 0, fieldErr(field, "must be a number, got %s", v)
	}
	return f, nil
}

func attemptsValue(field string, v json.RawMessage) (uint32, error) {
	f, err := numberValue(field, v)
	if err != nil {
		return 0, err
	}
	if f != math.Trunc(f) || f < 0 || f > math.MaxUint32 {
		return 0, fieldErr(field, "must be a whole number in [0, %d], got %s", uint32(math.MaxUint32), v)
	}
	return uint32(f), nil
}

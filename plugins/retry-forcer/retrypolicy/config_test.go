package retrypolicy_test

import (
	"errors"
	"math"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func TestDefault(t *testing.T) {
	g := NewWithT(t)
	g.Expect(retrypolicy.Default()).To(Equal(retrypolicy.Config{
		Policy: retrypolicy.Exponential, Base: 100 * ms, Factor: 2, Max: 30 * time.Second,
		Min: ms, Jitter: retrypolicy.JitterFull,
	}))
	g.Expect(retrypolicy.Default().Validate()).To(Succeed())

	cfg, err := retrypolicy.Parse([]byte(retrypolicy.DefaultSampleConfig))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg).To(Equal(retrypolicy.Default()), "the sample document is the default policy")
}

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want retrypolicy.Config
	}{
		{"empty document", "", retrypolicy.Default()},
		{"blank document", " \n\t\n", retrypolicy.Default()},
		{"only comments", "# nothing here\n", retrypolicy.Default()},
		{"empty JSON object", "{}", retrypolicy.Default()},
		{"YAML null", "null", retrypolicy.Default()},
		{"exponential overrides", "policy: exponential\nbase: 50ms\nfactor: 1.5\nmax: 1m\nmin: 5ms\njitter: none\nmaxAttempts: 8\n",
			retrypolicy.Config{Policy: retrypolicy.Exponential, Base: 50 * ms, Factor: 1.5, Max: time.Minute,
				Min: 5 * ms, Jitter: retrypolicy.JitterNone, MaxAttempts: 8}},
		{"policy left out means exponential", "factor: 3\n",
			exponentialCfg(func(c *retrypolicy.Config) { c.Factor = 3 })},
		{"JSON document", `{"policy": "exponential", "base": "200ms", "maxAttempts": 4}`,
			exponentialCfg(func(c *retrypolicy.Config) { c.Base = 200 * ms; c.MaxAttempts = 4 })},
		{"fixed defaults", "policy: fixed\n", retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: time.Second}},
		{"fixed", "policy: fixed\ndelay: 2500ms\nmaxAttempts: 3\n",
			retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: 2500 * ms, MaxAttempts: 3}},
		{"decorrelated defaults", "policy: decorrelated\n", decorrelatedCfg()},
		{"decorrelated", "policy: decorrelated\nbase: 1s\nmax: 1h30m\n",
			retrypolicy.Config{Policy: retrypolicy.Decorrelated, Base: time.Second, Max: 90 * time.Minute}},
		{"whole-number float attempts", "maxAttempts: 5.0\n", exponentialCfg(func(c *retrypolicy.Config) { c.MaxAttempts = 5 })},
		{"largest attempts", "maxAttempts: 4294967295\n",
			exponentialCfg(func(c *retrypolicy.Config) { c.MaxAttempts = math.MaxUint32 })},
		{"min equal to base", "min: 100ms\n", exponentialCfg(func(c *retrypolicy.Config) { c.Min = 100 * ms })},
		{"max equal to base", "base: 1s\nmax: 1s\n", exponentialCfg(func(c *retrypolicy.Config) { c.Base = time.Second; c.Max = time.Second })},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cfg, err := retrypolicy.Parse([]byte(tc.doc))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cfg).To(Equal(tc.want))
			g.Expect(cfg.Validate()).To(Succeed())
		})
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name  string
		doc   string
		field string
		msg   string // the whole error, or a part of it
	}{
		{"unknown policy", "policy: foo\n", "policy",
			`policy: unknown policy "foo" (exponential, fixed, decorrelated)`},
		{"policy spelled with a capital", "policy: Exponential\n", "policy", `unknown policy "Exponential"`},
		{"policy not a string", "policy: 3\n", "policy", "policy: must be a string, got 3"},
		{"base not a duration", "base: abc\n", "base", `base: "abc" is not a duration`},
		{"base without a unit", "base: 100\n", "base", "base: 100 is not a duration"},
		{"base zero", "base: 0s\n", "base", "base: must be > 0, got 0s"},
		{"base negative", "base: -1s\n", "base", "base: must be > 0, got -1s"},
		{"base empty", "base:\n", "base", "base: has no value"},
		{"factor below one", "factor: 0.5\n", "factor", "factor: must be >= 1, got 0.5"},
		{"factor zero", "factor: 0\n", "factor", "factor: must be >= 1, got 0"},
		{"factor a string", "factor: two\n", "factor", `factor: must be a number, got "two"`},
		{"max below base", "base: 1s\nmax: 500ms\n", "max", "max: must be >= base (1s), got 500ms"},
		{"min zero", "min: 0s\n", "min", "min: must be > 0, got 0s"},
		{"min above base", "min: 200ms\n", "min", "min: must be <= base (100ms), got 200ms"},
		{"unknown jitter", "jitter: half\n", "jitter", `jitter: unknown jitter "half" (full, none)`},
		{"jitter a YAML boolean", "jitter: off\n", "jitter", "jitter: must be a string, got false"},
		{"negative attempts", "maxAttempts: -1\n", "maxAttempts", "maxAttempts: must be a whole number in [0, 4294967295], got -1"},
		{"fractional attempts", "maxAttempts: 1.5\n", "maxAttempts", "got 1.5"},
		{"too many attempts", "maxAttempts: 4294967296\n", "maxAttempts", "got 4294967296"},
		{"attempts a string", `maxAttempts: "3"`, "maxAttempts", `maxAttempts: must be a number, got "3"`},
		{"delay with exponential", "delay: 1s\n", "delay", "delay: does not apply to policy exponential (only to fixed)"},
		{"base with fixed", "policy: fixed\nbase: 1s\n", "base", "base: does not apply to policy fixed (only to exponential, decorrelated)"},
		{"jitter with fixed", "policy: fixed\njitter: none\n", "jitter", "jitter: does not apply to policy fixed (only to exponential)"},
		{"factor with decorrelated", "policy: decorrelated\nfactor: 2\n", "factor", "factor: does not apply to policy decorrelated"},
		{"min with decorrelated", "policy: decorrelated\nmin: 1ms\n", "min", "min: does not apply to policy decorrelated"},
		{"delay zero with fixed", "policy: fixed\ndelay: 0s\n", "delay", "delay: must be > 0, got 0s"},
		{"decorrelated max below base", "policy: decorrelated\nbase: 2s\nmax: 1s\n", "max", "max: must be >= base (2s), got 1s"},
		{"unknown field", "policy: fixed\nretries: 3\n", "retries", "retries: unknown field (known: policy, base, factor"},
		{"field with the wrong case", "maxattempts: 3\n", "maxattempts", "maxattempts: unknown field"},
		{"duplicate field", "base: 1s\nbase: 2s\n", "document", `document: not valid YAML or JSON: yaml: unmarshal errors: line 2: key "base" already set in map`},
		{"not a mapping", "- policy: fixed\n", "document", `document: must be a flat mapping of fields (e.g. policy: exponential), got [{"policy":"fixed"}]`},
		{"a scalar", "exponential\n", "document", `document: must be a flat mapping of fields (e.g. policy: exponential), got "exponential"`},
		{"broken YAML", "policy: [fixed\n", "document", "document: not valid YAML or JSON: yaml: line 1: did not find expected ',' or ']'"},
		{"broken JSON", `{"policy": "fixed",`, "document", "document: not valid YAML or JSON"},
		{"nested value", "base: {value: 1s}\n", "base", `base: {"value":"1s"} is not a duration`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := retrypolicy.Parse([]byte(tc.doc))
			g.Expect(err).To(MatchError(ContainSubstring(tc.msg)))
			var fe *retrypolicy.FieldError
			g.Expect(errors.As(err, &fe)).To(BeTrue(), "a *FieldError")
			g.Expect(fe.Field).To(Equal(tc.field))
			g.Expect(err.Error()).To(HavePrefix(tc.field + ": "))
		})
	}
}

func TestValidate(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name string
		cfg  retrypolicy.Config
		err  string // empty: valid
	}{
		{"default", retrypolicy.Default(), ""},
		{"fixed", retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: time.Second}, ""},
		{"decorrelated", decorrelatedCfg(), ""},
		{"zero config", retrypolicy.Config{}, `policy: unknown policy "" (exponential, fixed, decorrelated)`},
		{"exponential without base", exponentialCfg(func(c *retrypolicy.Config) { c.Base = 0 }), "base: must be > 0, got 0s"},
		{"factor NaN", exponentialCfg(func(c *retrypolicy.Config) { c.Factor = nan }), "factor: must be >= 1, got NaN"},
		{"factor infinite", exponentialCfg(func(c *retrypolicy.Config) { c.Factor = math.Inf(1) }), "factor: must be >= 1, got +Inf"},
		{"exponential without jitter mode", exponentialCfg(func(c *retrypolicy.Config) { c.Jitter = "" }), `jitter: unknown jitter ""`},
		{"exponential with delay", exponentialCfg(func(c *retrypolicy.Config) { c.Delay = time.Second }), "delay: does not apply to policy exponential"},
		{"fixed with max", retrypolicy.Config{Policy: retrypolicy.Fixed, Delay: time.Second, Max: time.Minute}, "max: does not apply to policy fixed"},
		{"decorrelated with jitter", retrypolicy.Config{Policy: retrypolicy.Decorrelated, Base: ms, Max: time.Second, Jitter: "full"}, "jitter: does not apply to policy decorrelated"},
		{"decorrelated without max", retrypolicy.Config{Policy: retrypolicy.Decorrelated, Base: ms}, "max: must be >= base (1ms), got 0s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := tc.cfg.Validate()
			if tc.err == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.err)))
		})
	}
}

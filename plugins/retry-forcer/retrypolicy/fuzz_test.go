package retrypolicy_test

import (
	"errors"
	"testing"

	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

// FuzzParse: any policy document is a valid Config or a *FieldError naming a field; never a
// panic, and a parsed Config always builds a policy.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		retrypolicy.DefaultSampleConfig, "policy: fixed\ndelay: 1s\n", `{"policy":"decorrelated","base":"10ms","max":"1s"}`,
		"policy: exponential\nfactor: 1e308\nbase: 1ns\n", "maxAttempts: -1", "base: 1h\nmax: 1m", "policy: [", "transientMax: 0s",
		"invalidAttempts: 0", "a: b\na: c", "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		cfg, err := retrypolicy.Parse(doc)
		if err != nil {
			var fe *retrypolicy.FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("%q: %v is not a *FieldError naming a field", doc, err)
			}
			return
		}
		p, err := retrypolicy.NewPolicy(cfg)
		if err != nil {
			t.Fatalf("%q parsed to %+v, which does not build: %v", doc, cfg, err)
		}
		for round := range uint32(40) {
			d, giveUp := p.Next(round, p.MaxDelay())
			if !giveUp && (d < p.Floor() || d > p.MaxDelay()) {
				t.Fatalf("%q: round %d delay %s outside [%s, %s]", doc, round, d, p.Floor(), p.MaxDelay())
			}
		}
	})
}

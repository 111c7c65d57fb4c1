// Package kdshost_test checks the repository's layout rules (DESIGN.md, Layout): which folder
// may import which.
package kdshost_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kds-host/kds-host/"

// allowed says, for a package under a folder, which folders of the module it may depend on.
var allowed = []struct {
	under string
	may   []string
}{
	{"proto/", []string{"proto/"}},
	{"shared/", []string{"shared/", "proto/"}},
	{"plugins/retry-forcer/", []string{"plugins/retry-forcer/", "shared/", "proto/"}},
	{"plugins/owner-check/", []string{"plugins/owner-check/", "shared/", "proto/"}},
	{"host/", []string{"host/", "shared/", "proto/", "plugins/"}},
}

func TestLayout(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps=false", "-f", `{{.ImportPath}} {{.Name}} {{join .Deps " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	names := map[string]string{} // package -> package name
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		names[f[0]] = f[1]
		deps[f[0]] = f[2:]
	}
	if len(names) < 5 {
		t.Fatalf("go list found only %d packages", len(names))
	}
	for pkg, ds := range deps {
		rel := strings.TrimPrefix(pkg, module) + "/"
		for _, rule := range allowed {
			if !strings.HasPrefix(rel, rule.under) {
				continue
			}
			for _, d := range ds {
				if !strings.HasPrefix(d, module) {
					continue
				}
				drel := strings.TrimPrefix(d, module) + "/"
				ok := false
				for _, m := range rule.may {
					ok = ok || strings.HasPrefix(drel, m)
				}
				if !ok {
					t.Errorf("%s depends on %s: %s may depend only on %v", rel, drel, rule.under, rule.may)
				}
				if names[d] == "main" {
					t.Errorf("%s depends on %s, a main package", rel, drel)
				}
			}
		}
	}
}

package kdshost_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// libraryPackages are the public library's packages whose documentation is held to the
// adopter's vocabulary, as go list patterns. guard/... and policy are the next to join, once
// their move out of kds-host's words is done; every pattern here must name packages that exist.
var libraryPackages = []string{"./engine/...", "./internal/serial", "./internal/shrink", "./internal/lograte"}

// kdsWord is a word of kds-host's own vocabulary: zone, zones or KDS, whole, in any case.
var kdsWord = regexp.MustCompile(`(?i)\b(zones?|kds)\b`)

// kdsWords returns the lines of a package's documentation that speak of zones or KDS. A line that
// names kds-host (its own use: "kds-host's zones send ...", an import path) may.
func kdsWords(doc string) []string {
	var found []string
	for _, line := range strings.Split(doc, "\n") {
		if strings.Contains(strings.ToLower(line), "kds-host") {
			continue
		}
		if kdsWord.MatchString(line) {
			found = append(found, strings.TrimSpace(line))
		}
	}
	return found
}

func TestKDSWordsAreFoundOutsideLinesThatNameKDSHost(t *testing.T) {
	g := NewWithT(t)
	g.Expect(kdsWords("Machine is one zone stream's retry state.\nsent on the KDS stream\nevery Zones entry")).
		To(HaveLen(3))
	g.Expect(kdsWords("package event // import \"github.com/kds-host/kds-host/engine/event\"\n" +
		"kds-host's zones name it by kind (Mesh/default)\nthe structured rejection list (kds-host's kds.v1.RejectionList)")).
		To(BeEmpty())
	g.Expect(kdsWords("zone_independent, kdsv1.RejectionList, ozone, kdsx")).To(BeEmpty(), "whole words only")
}

// In the library's API and docs a client is a node and a kind is a type URL: `go doc -all` of a
// library package never says zone or KDS, but where it names kds-host's own use.
func TestTheLibrarySpeaksOfNodes(t *testing.T) {
	g := NewWithT(t)
	for _, pattern := range libraryPackages {
		dir := strings.TrimSuffix(strings.TrimPrefix(pattern, "./"), "/...")
		_, err := os.Stat(dir)
		g.Expect(err).NotTo(HaveOccurred(), "libraryPackages names %s", pattern)
	}
	out, err := exec.Command("go", append([]string{"list", "-f", "{{.ImportPath}}"}, libraryPackages...)...).CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "go list: %s", out)
	pkgs := strings.Fields(string(out))
	g.Expect(len(pkgs)).To(BeNumerically(">=", len(libraryPackages)), "every pattern names a package: %s", out)
	speaking := map[string][]string{} // package -> its lines that speak of zones or KDS
	for _, pkg := range pkgs {
		doc, err := exec.Command("go", "doc", "-all", pkg).CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), "go doc -all %s: %s", pkg, doc)
		if found := kdsWords(string(doc)); len(found) > 0 {
			speaking[pkg] = found
		}
	}
	g.Expect(speaking).To(BeEmpty(), "say node, type URL, xDS; or name kds-host where its own use is the point")
}

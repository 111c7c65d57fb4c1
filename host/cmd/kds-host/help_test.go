package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpNamesFilesThatExist: every examples/... path a command's help shows is in the
// repository, so a newcomer can run the example as printed.
func TestHelpNamesFilesThatExist(t *testing.T) {
	path := regexp.MustCompile(`examples/[\w./-]+\.(ya?ml|json)`)
	seen := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, p := range path.FindAllString(c.Long+"\n"+c.Example, -1) {
			seen++
			if _, err := os.Stat(filepath.Join("..", "..", "..", p)); err != nil {
				t.Errorf("%s --help names %s, which does not exist", c.CommandPath(), p)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if seen == 0 {
		t.Fatal("no help names an examples/ file: the test looks at nothing")
	}
}

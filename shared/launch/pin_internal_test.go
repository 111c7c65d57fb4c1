package launch

import (
	"os"
	"testing"

	. "github.com/onsi/gomega"
)

func TestOnlyARegularFileIsCopied(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	_, _, err := copyPinned(os.DevNull, dir, make([]byte, 32))
	g.Expect(err).To(MatchError(ContainSubstring(os.DevNull + " is not a regular file")))
	g.Expect(os.ReadDir(dir)).To(BeEmpty())
}

package launch_test

import (
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/kds-host/kds-host/shared/launch"
)

// scriptPlugin makes a folder as a script plugin has it: a launcher script that runs the real
// program beside it (here the reference retry-forcer binary) and a file it does not run.
func scriptPlugin(t *testing.T) (launcher, dir string) {
	t.Helper()
	dir = t.TempDir()
	copyFile(t, retryForcerBin(t), dir)
	launcher = filepath.Join(dir, "plugin.sh")
	if err := os.WriteFile(launcher, []byte("#!/bin/sh\nexec \"$(dirname \"$0\")/retry-forcer\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "proto", "v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "proto", "v1", "a file.proto"), []byte("syntax = \"proto3\";\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return launcher, dir
}

// TestTheFolderChecksumIsWhatCoreutilsPrint: the checksum a person computes by hand in the
// folder, with the pipeline the docs give, is the folder pin's; links are left out.
func TestTheFolderChecksumIsWhatCoreutilsPrint(t *testing.T) {
	for _, tool := range []string{"find", "sort", "xargs", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here", tool)
		}
	}
	g := NewWithT(t)
	launcher, dir := scriptPlugin(t)
	g.Expect(os.Symlink("/etc/hostname", filepath.Join(dir, "a-link"))).To(Succeed())
	sum, err := launch.FolderChecksum(launcher)
	g.Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command("sh", "-c", "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum")
	cmd.Dir = dir
	out, err := cmd.Output()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(strings.Fields(string(out))[0]).To(Equal(sum))

	// Through a symbolic link to the launcher: the folder of what it points to.
	link := filepath.Join(t.TempDir(), "my-plugin")
	g.Expect(os.Symlink(launcher, link)).To(Succeed())
	g.Expect(launch.FolderChecksum(link)).To(Equal(sum))
}

// TestAFolderPinCoversWhatTheLauncherRuns: issue 25. A pin of a script plugin's launcher alone
// covers nothing of the program it runs; a folder pin runs every file of the folder from a
// private copy of exactly what was hashed, and refuses the folder once any file in it changed.
func TestAFolderPinCoversWhatTheLauncherRuns(t *testing.T) {
	g := NewWithT(t)
	launcher, dir := scriptPlugin(t)
	sum, err := launch.FolderChecksum(launcher)
	g.Expect(err).NotTo(HaveOccurred())
	want, _ := hex.DecodeString(sum)
	copies := t.TempDir()

	p := start(t, launch.Options{Path: launcher, SHA256: want, PinFolder: true, CopyDir: copies})
	g.Expect(describe(p)).To(Equal("retry-forcer"))
	ran := exe(t, p.Pid())
	g.Expect(ran).To(HavePrefix(copies+string(filepath.Separator)), "the program the launcher runs is the copy's")
	g.Expect(filepath.Join(filepath.Dir(ran), "proto", "v1", "a file.proto")).To(BeAnExistingFile(), "and the files beside it")
	g.Expect(p.Kill()).To(Succeed())
	g.Expect(os.ReadDir(copies)).To(BeEmpty(), "the copy is removed with the process")

	// The program beside the launcher changes: the launcher's own checksum does not, the
	// folder's does.
	g.Expect(os.WriteFile(filepath.Join(dir, "retry-forcer"), []byte("#!/bin/sh\nexit 3\n"), 0o755)).To(Succeed())
	_, err = launch.Start(t.Context(), launch.Options{Path: launcher, SHA256: want, PinFolder: true, CopyDir: copies})
	var ce *launch.ChecksumError
	g.Expect(errors.As(err, &ce)).To(BeTrue(), "%v", err)
	g.Expect(err.Error()).To(And(ContainSubstring("plugin "+launcher+": checksum mismatch of its folder "+dir),
		ContainSubstring("expected sha256-folder:"+sum)))
	g.Expect(os.ReadDir(copies)).To(BeEmpty(), "nothing is left of a refused folder")
}

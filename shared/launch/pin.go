package launch

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// maxBinarySize bounds what is copied for a pinned plugin: no plugin binary is this large, and a
// path swapped for an endless file must not fill the disk.
const maxBinarySize = 1 << 30

// copyPrefix starts the name of each private folder a pinned binary is copied into.
const copyPrefix = "kds-host-plugin-"

// copyPinned copies the binary at path into a new private folder under dir (os.TempDir() when
// empty), hashing the bytes as it copies them, and returns the copy and its folder. The copy is
// what runs: whatever happens to path after it was read, the process runs the bytes that were
// hashed, from a file only this process's user can change (the folder is 0700, the copy 0500).
// A copy whose SHA-256 is not want is a *ChecksumError, and nothing is left behind.
func copyPinned(path, dir string, want []byte) (bin, private string, err error) {
	src, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return "", "", err
	}
	if !fi.Mode().IsRegular() {
		return "", "", fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	folder, err := os.MkdirTemp(dir, copyPrefix)
	if err != nil {
		return "", "", fmt.Errorf("a private folder for the pinned binary: %w", err)
	}
	defer func() {
		if err != nil {
			_ = removeCopy(folder)
		}
	}()
	bin = filepath.Join(folder, filepath.Base(path))
	sum, err := writeCopy(bin, src)
	if err != nil {
		return "", "", fmt.Errorf("copy %s to %s: %w", path, folder, err)
	}
	if !bytes.Equal(sum, want) {
		return "", "", &ChecksumError{Expected: hex.EncodeToString(want), Actual: hex.EncodeToString(sum)}
	}
	if err := os.Chmod(bin, 0o500); err != nil {
		return "", "", err
	}
	return bin, folder, nil
}

// writeCopy writes what src holds to a new file dst and returns its SHA-256.
//
// It holds syscall.ForkLock for reading while dst is open for writing, as the standard library
// does for the descriptors it creates: a process forked meanwhile (another plugin's start)
// would inherit the descriptor until it execs, and exec of the copy fails with ETXTBSY ("text
// file busy") while any process holds it open for writing (golang/go#22315).
func writeCopy(dst string, src io.Reader) ([]byte, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o700)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(src, maxBinarySize+1))
	if err == nil && n > maxBinarySize {
		err = fmt.Errorf("it is larger than %d bytes, which no plugin binary is", maxBinarySize)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// removeCopy removes a private folder made by copyPinned.
func removeCopy(private string) error {
	// Writable again first: some systems refuse to remove a read-only file.
	entries, _ := os.ReadDir(private)
	for _, e := range entries {
		_ = os.Chmod(filepath.Join(private, e.Name()), 0o700)
	}
	if err := os.RemoveAll(private); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the pinned binary's copy: %w", err)
	}
	return nil
}

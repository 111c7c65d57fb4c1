package launch

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// maxFolderFiles bounds how many files a folder pin hashes and copies.
const maxFolderFiles = 100_000

// A folder pin (Options.PinFolder) covers what a script plugin runs: the file at Path and every
// other file of the folder it is in (its modules, its .proto files, its node_modules), not only
// the launcher. The folder's checksum is the SHA-256 of a listing with one line per regular file
// under the folder, at any depth, in byte order of the paths:
//
//	<hex SHA-256 of the file>  ./<path relative to the folder, with />\n
//
// which is what sha256sum prints, so that, in the folder,
//
//	find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum
//
// prints it too. Symbolic links and other special files are neither hashed nor copied; file
// modes other than the executable bits do not count. The folder of Path is the folder of the
// file Path resolves to (a symbolic link in bin/ pins the folder of what it points to).

// FolderChecksum is the hex checksum of the folder of the file at path, as a folder pin
// (PATH@sha256-folder:HEX) wants it.
func FolderChecksum(path string) (string, error) {
	root, _, err := pinRoot(path)
	if err != nil {
		return "", err
	}
	files, err := folderFiles(root)
	if err != nil {
		return "", err
	}
	sums := make([][]byte, len(files))
	for i, f := range files {
		s, err := FileSHA256(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return "", err
		}
		sums[i], _ = hex.DecodeString(s)
	}
	return hex.EncodeToString(listingSum(files, sums)), nil
}

// pinRoot is the folder of a folder pin and the entry's path in it.
func pinRoot(path string) (root, entry string, err error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", "", err
	}
	if fi, err := os.Stat(resolved); err != nil {
		return "", "", err
	} else if !fi.Mode().IsRegular() {
		return "", "", fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	return filepath.Dir(resolved), filepath.Base(resolved), nil
}

// folderFiles lists the regular files under root, as slash-separated paths relative to it, in
// byte order of "./" and the path (the order of sort -z under LC_ALL=C).
func folderFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil // folders are walked; links and special files are left out
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if strings.ContainsAny(rel, "\n\\") {
			return fmt.Errorf("%s: a folder pin cannot name a file whose path holds a newline or a backslash", p)
		}
		if files = append(files, rel); len(files) > maxFolderFiles {
			return fmt.Errorf("%s has more than %d files, which no plugin's folder has", root, maxFolderFiles)
		}
		return nil
	})
	slices.SortFunc(files, func(a, b string) int { return strings.Compare("./"+a, "./"+b) })
	return files, err
}

// listingSum is the folder checksum of files with their SHA-256s.
func listingSum(files []string, sums [][]byte) []byte {
	var listing bytes.Buffer
	for i, f := range files {
		fmt.Fprintf(&listing, "%x  ./%s\n", sums[i], f)
	}
	sum := sha256.Sum256(listing.Bytes())
	return sum[:]
}

// copyPinnedFolder copies the folder of the file at p into a new private folder under dir
// (os.TempDir() when empty), hashing every file as it copies it, and returns the copy of that
// file, the private folder, and the file's own SHA-256. As copyPinned does for one file: the
// copy is what runs, a folder whose checksum is not want is a *ChecksumError, and nothing is
// left behind then.
func copyPinnedFolder(p, dir string, want []byte) (bin, private string, binSum []byte, err error) {
	root, entry, err := pinRoot(p)
	if err != nil {
		return "", "", nil, err
	}
	files, err := folderFiles(root)
	if err != nil {
		return "", "", nil, err
	}
	folder, err := os.MkdirTemp(dir, copyPrefix)
	if err != nil {
		return "", "", nil, fmt.Errorf("a private folder for the pinned folder: %w", err)
	}
	defer func() {
		if err != nil {
			_ = removeCopy(folder)
		}
	}()
	sums := make([][]byte, len(files))
	var total int64
	for i, f := range files {
		src := filepath.Join(root, filepath.FromSlash(f))
		dst := filepath.Join(folder, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return "", "", nil, err
		}
		mode, n, sum, err := copyFile(src, dst)
		if err != nil {
			return "", "", nil, fmt.Errorf("copy %s to %s: %w", src, folder, err)
		}
		if total += n; total > maxBinarySize {
			return "", "", nil, fmt.Errorf("%s holds more than %d bytes, which no plugin's folder does", root, maxBinarySize)
		}
		perm := os.FileMode(0o400)
		if mode&0o111 != 0 {
			perm = 0o500
		}
		if err := os.Chmod(dst, perm); err != nil {
			return "", "", nil, err
		}
		sums[i] = sum
		if path.Clean(f) == entry {
			binSum = sum
		}
	}
	if got := listingSum(files, sums); !bytes.Equal(got, want) {
		return "", "", nil, &ChecksumError{Folder: root, Expected: hex.EncodeToString(want), Actual: hex.EncodeToString(got)}
	}
	return filepath.Join(folder, entry), folder, binSum, nil
}

// copyFile copies the regular file src to a new file dst, and returns src's mode, the bytes
// copied and their SHA-256.
func copyFile(src, dst string) (fs.FileMode, int64, []byte, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, 0, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, nil, err
	}
	if !fi.Mode().IsRegular() {
		return 0, 0, nil, fmt.Errorf("%s is not a regular file any more (%s)", src, fi.Mode().Type())
	}
	sum, err := writeCopy(dst, f)
	if err != nil {
		return 0, 0, nil, err
	}
	st, err := os.Stat(dst)
	if err != nil {
		return 0, 0, nil, err
	}
	return fi.Mode(), st.Size(), sum, nil
}

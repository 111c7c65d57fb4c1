package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"filippo.io/edwards25519"
)

// Keys signs tokens with one key and verifies them with every key it knows.
type Keys struct {
	signing   ed25519.PrivateKey
	signingID string
	verify    map[string]*verifyKey
	batch     batcher
}

// SigningKeyFile is where a global keeps the key it signs tokens with, under its data dir.
const SigningKeyFile = "keys/token-signing.key"

// LoadKeys reads the signing key from signingFile, or, when it is empty, from
// dataDir/SigningKeyFile, making that key (0600) on first start. Each of verifyFiles (a PEM
// public or private Ed25519 key) is accepted for verification too: keep a rotated-out key
// there until the tokens it signed are gone.
func LoadKeys(dataDir, signingFile string, verifyFiles []string) (*Keys, error) {
	if signingFile == "" {
		signingFile = filepath.Join(dataDir, SigningKeyFile)
		if _, err := os.Stat(signingFile); errors.Is(err, fs.ErrNotExist) {
			if err := writeNewKey(signingFile); err != nil {
				return nil, fmt.Errorf("make the token signing key %s: %w", signingFile, err)
			}
		}
	}
	priv, err := readPrivate(signingFile)
	if err != nil {
		return nil, err
	}
	k := newKeys(priv)
	for _, f := range verifyFiles {
		p, err := readPublic(f)
		if err != nil {
			return nil, err
		}
		if err := k.addVerify(p); err != nil {
			return nil, fmt.Errorf("token verification key %s: %w", f, err)
		}
	}
	return k, nil
}

func newKeys(signing ed25519.PrivateKey) *Keys {
	pub := signing.Public().(ed25519.PublicKey)
	k := &Keys{signing: signing, signingID: keyID(pub), verify: map[string]*verifyKey{}}
	if err := k.addVerify(pub); err != nil {
		panic(err) // the public half of a private key (derived from its seed) is a point
	}
	return k
}

// addVerify accepts tokens signed by pub.
func (k *Keys) addVerify(pub ed25519.PublicKey) error {
	point, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return fmt.Errorf("not an Ed25519 public key: %w", err)
	}
	k.verify[keyID(pub)] = &verifyKey{pub: pub, point: point}
	return nil
}

// NewKeys returns keys around a fresh signing key, kept in memory only (tests, benchmarks).
func NewKeys() (*Keys, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return newKeys(priv), nil
}

// KeyIDs lists the ids of the keys that verify, the signing key's first.
func (k *Keys) KeyIDs() []string {
	out := []string{k.signingID}
	for id := range k.verify {
		if id != k.signingID {
			out = append(out, id)
		}
	}
	slices.Sort(out[1:])
	return out
}

func writeNewKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

func readPrivate(path string) (ed25519.PrivateKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("token signing key %s: %w", path, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("token signing key %s: want an Ed25519 key, got %T", path, key)
	}
	return priv, nil
}

func readPublic(path string) (ed25519.PublicKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	if block.Type == "PRIVATE KEY" {
		priv, err := readPrivate(path)
		if err != nil {
			return nil, err
		}
		return priv.Public().(ed25519.PublicKey), nil
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("token verification key %s: %w", path, err)
	}
	pub, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("token verification key %s: want an Ed25519 key, got %T", path, key)
	}
	return pub, nil
}

func readPEM(path string) (*pem.Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w", path, err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("key %s: no PEM block", path)
	}
	return block, nil
}

// PublicPEM is the signing key's public half, for another replica's verification keys.
func (k *Keys) PublicPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(k.signing.Public())
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// WriteFileAtomic writes data to path (creating its directory, 0700) through a temporary file
// and a rename, so a reader never sees half a file, with the given mode.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename, nothing is there
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// AdminTokenFile is where a global keeps its admin token, under its data dir; the CLI on the
// same machine finds it there.
const AdminTokenFile = "admin.token"

// EnsureAdminToken returns the admin token kept at dataDir/AdminTokenFile, issuing it (0600) on
// first start, or again when the one there no longer verifies (its key was rotated out).
func EnsureAdminToken(k *Keys, dataDir string, now time.Time) (path string, err error) {
	path = filepath.Join(dataDir, AdminTokenFile)
	if b, err := os.ReadFile(path); err == nil {
		if _, err := k.Verify(string(bytes.TrimSpace(b)), now); err == nil {
			return path, nil
		}
	}
	tok, err := k.Issue(Claims{Kind: KindUser, Name: "admin", Groups: []string{GroupAdmin}}, 0, now)
	if err != nil {
		return "", err
	}
	if err := WriteFileAtomic(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write the admin token %s: %w", path, err)
	}
	return path, nil
}

// ReadTokenFile reads a token from a file, without its surrounding white space.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	t := string(bytes.TrimSpace(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return t, nil
}

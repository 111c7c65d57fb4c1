// Package auth issues and checks kds-host's tokens: zone tokens, with which a zone proves its name
// on its KDS stream, and user tokens, with which an operator uses the global's API. Tokens are
// signed with Ed25519 keys the global keeps under its data dir; several keys may verify at once,
// so a signing key can be rotated without cutting off the zones that hold older tokens.
package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// What a token is for.
const (
	KindZone = "zone" // a zone control plane's KDS stream
	KindUser = "user" // an operator on the API
	// KindReplica is a global replica following another's changes relay. Replicas issue these
	// to themselves, for a minute, from the signing key they share; no API issues one.
	KindReplica = "replica"
)

// The groups of a user token.
const (
	GroupAdmin    = "admin"     // everything: writes, reloads, tokens
	GroupReadOnly = "read-only" // reads, insights
)

// MaxTokenSize bounds a token's length; a longer one is refused before it is decoded.
const MaxTokenSize = 4 << 10

// prefix starts every token: the format and its version.
const prefix = "kds1."

// Claims are what a token says.
type Claims struct {
	Kind string `json:"kind"`
	// Name is the zone's name (KindZone), the user's (KindUser) or the replica's (KindReplica).
	Name   string   `json:"name"`
	Groups []string `json:"groups,omitempty"`
	// IssuedAt and Expires are Unix seconds; Expires 0 never expires.
	IssuedAt int64  `json:"iat"`
	Expires  int64  `json:"exp,omitempty"`
	ID       string `json:"jti"`
	// KeyID names the key that signed it.
	KeyID string `json:"kid"`
}

// InGroup reports whether the claims name the group.
func (c Claims) InGroup(g string) bool { return slices.Contains(c.Groups, g) }

// Errors of Verify, wrapped with the detail.
var (
	ErrMalformed    = errors.New("malformed token")
	ErrUnknownKey   = errors.New("token signed by a key this control plane does not know")
	ErrBadSignature = errors.New("token signature does not verify")
	ErrExpired      = errors.New("token expired")
)

// ValidName reports what is wrong with a zone or user name, or nil. A name is what a Kuma zone
// name may be, no longer than a DNS name's 253 characters: lowercase letters, digits, '-' and
// '.', starting and ending with a letter or digit. (Every zone stream checks its token's name: a
// loop, not a regular expression: BenchmarkValidName, about a fiftieth of its cost.)
func ValidName(name string) error {
	ok := len(name) >= 1 && len(name) <= 253 && alnum(name[0]) && alnum(name[len(name)-1])
	for i := 1; ok && i < len(name)-1; i++ {
		ok = alnum(name[i]) || name[i] == '-' || name[i] == '.'
	}
	if !ok {
		return fmt.Errorf("name %q: want lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters", name)
	}
	return nil
}

func alnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// Issue signs claims with the signing key. validFor 0 never expires.
func (k *Keys) Issue(c Claims, validFor time.Duration, now time.Time) (string, error) {
	if !validKind(c.Kind) {
		return "", fmt.Errorf("token kind %q: want %s, %s or %s", c.Kind, KindZone, KindUser, KindReplica)
	}
	if err := ValidName(c.Name); err != nil {
		return "", err
	}
	if validFor < 0 {
		return "", fmt.Errorf("valid for %s: must not be negative", validFor)
	}
	for _, g := range c.Groups {
		if g != GroupAdmin && g != GroupReadOnly {
			return "", fmt.Errorf("group %q: want %s or %s", g, GroupAdmin, GroupReadOnly)
		}
	}
	id := make([]byte, 12)
	if _, err := rand.Read(id); err != nil {
		return "", err
	}
	c.ID, c.KeyID, c.IssuedAt = hex.EncodeToString(id), k.signingID, now.Unix()
	c.Expires = 0
	if validFor > 0 {
		c.Expires = now.Add(validFor).Unix()
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	signed := prefix + base64.RawURLEncoding.EncodeToString(payload)
	sig := ed25519.Sign(k.signing, []byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// Verify checks a token's signature against the keys it knows and its expiry at now, and
// returns what it says.
func (k *Keys) Verify(token string, now time.Time) (Claims, error) {
	var c Claims
	if len(token) > MaxTokenSize {
		return c, fmt.Errorf("%w: longer than %d bytes", ErrMalformed, MaxTokenSize)
	}
	if !strings.HasPrefix(token, prefix) {
		return c, fmt.Errorf("%w: it does not start with %q", ErrMalformed, prefix)
	}
	i := strings.LastIndexByte(token, '.')
	if i < len(prefix) {
		return c, fmt.Errorf("%w: no signature", ErrMalformed)
	}
	signed, sig64 := token[:i], token[i+1:]
	payload, err := base64.RawURLEncoding.DecodeString(signed[len(prefix):])
	if err != nil {
		return c, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(sig64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return c, fmt.Errorf("%w: bad signature encoding", ErrMalformed)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	key, ok := k.verify[c.KeyID]
	if !ok {
		return Claims{}, fmt.Errorf("%w (key id %q)", ErrUnknownKey, c.KeyID)
	}
	if !k.batch.check(&sigCheck{key: key, msg: []byte(signed), sig: sig}) {
		return Claims{}, ErrBadSignature
	}
	if c.Expires != 0 && now.Unix() >= c.Expires {
		return Claims{}, fmt.Errorf("%w at %s", ErrExpired, time.Unix(c.Expires, 0).UTC().Format(time.RFC3339))
	}
	if !validKind(c.Kind) || ValidName(c.Name) != nil {
		return Claims{}, fmt.Errorf("%w: kind %q, name %q", ErrMalformed, c.Kind, c.Name)
	}
	return c, nil
}

func validKind(k string) bool { return k == KindZone || k == KindUser || k == KindReplica }

// keyID names a public key: the first 8 bytes of its SHA-256, in hex.
func keyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

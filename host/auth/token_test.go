package auth_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/auth"
)

var now = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

func TestTokensRoundTripAndRefuseWhatIsWrong(t *testing.T) {
	g := NewWithT(t)
	k, err := auth.NewKeys()
	g.Expect(err).NotTo(HaveOccurred())
	tok, err := k.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-1"}, time.Hour, now)
	g.Expect(err).NotTo(HaveOccurred())
	c, err := k.Verify(tok, now.Add(59*time.Minute))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Kind).To(Equal(auth.KindZone))
	g.Expect(c.Name).To(Equal("zone-1"))

	_, err = k.Verify(tok, now.Add(time.Hour))
	g.Expect(err).To(MatchError(auth.ErrExpired))

	other, _ := auth.NewKeys()
	_, err = other.Verify(tok, now)
	g.Expect(err).To(MatchError(auth.ErrUnknownKey))

	// A changed payload with the old signature.
	parts := strings.Split(tok, ".")
	forged, err := k.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-2"}, time.Hour, now)
	g.Expect(err).NotTo(HaveOccurred())
	fparts := strings.Split(forged, ".")
	_, err = k.Verify(strings.Join([]string{parts[0], fparts[1], parts[2]}, "."), now)
	g.Expect(err).To(MatchError(auth.ErrBadSignature))

	for _, bad := range []string{"", "Bearer x", "kds1.", "kds1.!!!.x", "kds1.e30.AAAA", strings.Repeat("a", auth.MaxTokenSize+1)} {
		_, err = k.Verify(bad, now)
		g.Expect(err).To(MatchError(auth.ErrMalformed), "%q", bad)
	}

	_, err = k.Issue(auth.Claims{Kind: auth.KindZone, Name: "Zone_1"}, 0, now)
	g.Expect(err).To(MatchError(ContainSubstring("lowercase")))
	_, err = k.Issue(auth.Claims{Kind: "robot", Name: "x"}, 0, now)
	g.Expect(err).To(HaveOccurred())
	_, err = k.Issue(auth.Claims{Kind: auth.KindUser, Name: "x", Groups: []string{"root"}}, 0, now)
	g.Expect(err).To(MatchError(ContainSubstring(`group "root"`)))

	never, err := k.Issue(auth.Claims{Kind: auth.KindUser, Name: "ops", Groups: []string{auth.GroupReadOnly}}, 0, now)
	g.Expect(err).NotTo(HaveOccurred())
	c, err = k.Verify(never, now.AddDate(50, 0, 0))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.InGroup(auth.GroupReadOnly)).To(BeTrue())
	g.Expect(c.InGroup(auth.GroupAdmin)).To(BeFalse())
}

func TestKeysLiveInTheDataDirAndRotate(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	k1, err := auth.LoadKeys(dir, "", nil)
	g.Expect(err).NotTo(HaveOccurred())
	st, err := os.Stat(filepath.Join(dir, auth.SigningKeyFile))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o600)))
	tok, err := k1.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-1"}, 0, now)
	g.Expect(err).NotTo(HaveOccurred())

	again, err := auth.LoadKeys(dir, "", nil)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = again.Verify(tok, now)
	g.Expect(err).NotTo(HaveOccurred(), "the same key after a restart")

	// Rotation: a new signing key, the old one kept for verification.
	newDir := t.TempDir()
	k2, err := auth.LoadKeys(newDir, "", []string{filepath.Join(dir, auth.SigningKeyFile)})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = k2.Verify(tok, now)
	g.Expect(err).NotTo(HaveOccurred(), "a token of the old key still verifies")
	g.Expect(k2.KeyIDs()).To(HaveLen(2))
	pub, err := k2.PublicPEM()
	g.Expect(err).NotTo(HaveOccurred())
	pubFile := filepath.Join(t.TempDir(), "k2.pub")
	g.Expect(os.WriteFile(pubFile, pub, 0o644)).To(Succeed())
	k3, err := auth.LoadKeys(dir, "", []string{pubFile})
	g.Expect(err).NotTo(HaveOccurred())
	tok2, _ := k2.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-2"}, 0, now)
	_, err = k3.Verify(tok2, now)
	g.Expect(err).NotTo(HaveOccurred(), "a public key verifies")

	_, err = auth.LoadKeys(dir, filepath.Join(dir, "missing.key"), nil)
	g.Expect(err).To(MatchError(ContainSubstring("missing.key")))
}

func TestTheAdminTokenIsMadeOnceAndKeptPrivate(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	k, err := auth.LoadKeys(dir, "", nil)
	g.Expect(err).NotTo(HaveOccurred())
	path, err := auth.EnsureAdminToken(k, dir, now)
	g.Expect(err).NotTo(HaveOccurred())
	st, err := os.Stat(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o600)))
	first, err := auth.ReadTokenFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	c, err := k.Verify(first, now)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.InGroup(auth.GroupAdmin)).To(BeTrue())

	_, err = auth.EnsureAdminToken(k, dir, now.Add(time.Hour))
	g.Expect(err).NotTo(HaveOccurred())
	second, _ := auth.ReadTokenFile(path)
	g.Expect(second).To(Equal(first), "kept across restarts")

	other, _ := auth.NewKeys()
	_, err = auth.EnsureAdminToken(other, dir, now)
	g.Expect(err).NotTo(HaveOccurred())
	third, _ := auth.ReadTokenFile(path)
	g.Expect(third).NotTo(Equal(first), "re-issued when its key is gone")
}

// FuzzVerify: any input is refused with an error, or is a token this key signed; never a panic.
func FuzzVerify(f *testing.F) {
	k, err := auth.NewKeys()
	if err != nil {
		f.Fatal(err)
	}
	good, _ := k.Issue(auth.Claims{Kind: auth.KindZone, Name: "zone-1"}, time.Hour, now)
	for _, s := range []string{good, "", "kds1.", "kds1.e30.", "kds1.eyJraW5kIjoiem9uZSJ9.AAAA", good[:len(good)-2], good + "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := k.Verify(tok, now)
		if err == nil && (c.Name == "" || tok != good && !strings.HasPrefix(tok, "kds1.")) {
			t.Fatalf("accepted %q as %+v", tok, c)
		}
	})
}

// A replica token is a kind of its own: issued and verified as one, and never a zone's.
func TestReplicaTokens(t *testing.T) {
	g := NewWithT(t)
	k, err := auth.NewKeys()
	g.Expect(err).NotTo(HaveOccurred())
	tok, err := k.Issue(auth.Claims{Kind: auth.KindReplica, Name: "global-1-5685"}, time.Minute, now)
	g.Expect(err).NotTo(HaveOccurred())
	c, err := k.Verify(tok, now)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Kind).To(Equal(auth.KindReplica))
	_, err = k.Verify(tok, now.Add(time.Minute))
	g.Expect(err).To(MatchError(auth.ErrExpired))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	_, err = auth.ZoneAuth{Keys: k, Now: func() time.Time { return now }}.Authenticate(ctx)
	g.Expect(status.Code(err)).To(Equal(codes.PermissionDenied))
}

// The names ValidName takes are exactly those of the pattern a Kuma zone name follows, at most
// 253 characters: every string of the pattern's alphabet and a few others, up to 4 long, and
// the lengths around the limit.
func TestValidNameIsTheZoneNamePattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	alphabet := []byte("az09-.A_ /é")
	check := func(name string) {
		t.Helper()
		if got, want := auth.ValidName(name) == nil, pattern.MatchString(name); got != want {
			t.Fatalf("ValidName(%q) accepts: %v, the pattern: %v", name, got, want)
		}
	}
	var each func(prefix string, n int)
	each = func(prefix string, n int) {
		check(prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			each(prefix+string(c), n-1)
		}
	}
	each("", 4)
	for _, n := range []int{252, 253, 254, 300} {
		check(strings.Repeat("a", n))
		check(strings.Repeat("a", n-1) + "-")
		check("a" + strings.Repeat(".", n-2) + "a")
	}
}

func BenchmarkValidName(b *testing.B) {
	for b.Loop() {
		_ = auth.ValidName("zone-0042.eu-west-1")
	}
}

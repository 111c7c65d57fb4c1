package auth

import (
	"crypto/ed25519"
	"crypto/sha512"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"filippo.io/edwards25519"
	. "github.com/onsi/gomega"
)

// testKey is a key with what a test needs to sign in ways ed25519.Sign does not.
type testKey struct {
	priv ed25519.PrivateKey
	vk   *verifyKey
	a    *edwards25519.Scalar // the secret scalar
}

func newTestKey(seed byte) testKey {
	priv := ed25519.NewKeyFromSeed(make32(seed))
	pub := priv.Public().(ed25519.PublicKey)
	point, _ := new(edwards25519.Point).SetBytes(pub)
	h := sha512.Sum512(priv.Seed())
	a, _ := new(edwards25519.Scalar).SetBytesWithClamping(h[:32])
	return testKey{priv, &verifyKey{pub, point}, a}
}

func make32(b byte) []byte {
	s := make([]byte, 32)
	for i := range s {
		s[i] = b + byte(i)
	}
	return s
}

// signWithR signs msg with nonce r, its R moved by the point t: the signature is
// (R+t, r + H(R+t, A, msg)·a), which the cofactored equation accepts when t has small order.
func (k testKey) signWithR(msg []byte, r *edwards25519.Scalar, t *edwards25519.Point) []byte {
	R := new(edwards25519.Point).ScalarBaseMult(r)
	R.Add(R, t)
	h := sha512.New()
	h.Write(R.Bytes())
	h.Write(k.vk.pub)
	h.Write(msg)
	kk, _ := new(edwards25519.Scalar).SetUniformBytes(h.Sum(nil))
	S := new(edwards25519.Scalar).MultiplyAdd(kk, k.a, r)
	return append(R.Bytes(), S.Bytes()...)
}

// sForEncodedR returns S = H(enc, A, msg)·a: with R the encoding enc of a point of small order
// (r = 0), the signature (enc, S) meets the cofactored equation.
func (k testKey) sForEncodedR(enc, msg []byte) []byte {
	h := sha512.New()
	h.Write(enc)
	h.Write(k.vk.pub)
	h.Write(msg)
	kk, _ := new(edwards25519.Scalar).SetUniformBytes(h.Sum(nil))
	return new(edwards25519.Scalar).Multiply(kk, k.a).Bytes()
}

// order8 is a point of order 8.
func order8() *edwards25519.Point {
	p, err := new(edwards25519.Point).SetBytes([]byte{
		0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98, 0xf0,
		0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53, 0xfc, 0x05})
	if err != nil || new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) != 1 {
		panic("not a point of small order")
	}
	return p
}

// signatures returns checks ed25519.Verify accepts and refuses, each kind of refusal once or
// more, from two keys.
func signatures(t *testing.T) []*sigCheck {
	k1, k2 := newTestKey(1), newTestKey(2)
	var out []*sigCheck
	add := func(k testKey, msg string, sig []byte) {
		out = append(out, &sigCheck{key: k.vk, msg: []byte(msg), sig: sig})
	}
	for i := range 12 {
		k := k1
		if i%3 == 0 {
			k = k2
		}
		msg := fmt.Sprintf("kds1.token-%d", i)
		sig := ed25519.Sign(k.priv, []byte(msg))
		add(k, msg, sig) // good

		bad := append([]byte(nil), sig...)
		bad[40+i%20] ^= 1 << (i % 8) // S changed
		add(k, msg, bad)
		bad = append([]byte(nil), sig...)
		bad[i%31] ^= 1 << (i % 7) // R changed: another point, or none
		add(k, msg, bad)
		add(k, msg+"x", sig) // another message
		other := k2
		if k.vk == k2.vk {
			other = k1
		}
		add(other, msg, sig) // another key
	}
	msg := "kds1.edge"
	sig := ed25519.Sign(k1.priv, []byte(msg))
	// S + L: the same S modulo the order, which ed25519.Verify refuses.
	S, _ := new(edwards25519.Scalar).SetCanonicalBytes(sig[32:])
	sl := addOrder(S.Bytes())
	if sl != nil {
		add(k1, msg, append(append([]byte(nil), sig[:32]...), sl...))
	}
	// R encoded in ways that decode to a point of small order but that no point's Bytes gives:
	// each with the S that makes it good were its bytes taken as they are. ed25519.Verify refuses
	// them; so must a batch, though the cofactored equation alone would not.
	for _, enc := range [][]byte{
		append([]byte{0xee}, append(bytesOf(0xff, 30), 0x7f)...), // y = p+1: the identity
		append([]byte{0x01}, append(bytesOf(0, 30), 0x80)...),    // y = 1, x = 0 with the sign bit
		append([]byte{0xec}, append(bytesOf(0xff, 30), 0xff)...), // y = p-1, x = 0 with the sign bit
		append([]byte{0xee}, append(bytesOf(0xff, 30), 0xff)...), // y = p+1 with the sign bit
		append(append([]byte{0x01}, bytesOf(0, 30)...), 0x00),    // y = 1: canonical, and good
	} {
		add(k1, msg, append(enc, k1.sForEncodedR(enc, []byte(msg))...))
	}
	return out
}

func bytesOf(b byte, n int) []byte {
	s := make([]byte, n)
	for i := range s {
		s[i] = b
	}
	return s
}

// addOrder returns s + L as 32 little-endian bytes, or nil when that does not fit in 253 bits.
func addOrder(s []byte) []byte {
	l := []byte{0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10}
	out := make([]byte, 32)
	carry := 0
	for i := range out {
		v := int(s[i]) + int(l[i]) + carry
		out[i], carry = byte(v), v>>8
	}
	if carry != 0 || out[31]&0xe0 != 0 {
		return nil
	}
	return out
}

func TestABatchAgreesWithEd25519Verify(t *testing.T) {
	g := NewWithT(t)
	pool := signatures(t)
	want := make([]bool, len(pool))
	goods := 0
	for i, c := range pool {
		want[i] = ed25519.Verify(c.key.pub, c.msg, c.sig)
		if want[i] {
			goods++
		}
	}
	g.Expect(goods).To(Equal(13), "12 signed, and R the identity canonically encoded")

	rng := rand.New(rand.NewPCG(1, 2))
	check := func(what string, idx []int) {
		batch := make([]*sigCheck, len(idx))
		for j, i := range idx {
			c := *pool[i]
			batch[j] = &c
		}
		verifyBatch(batch)
		for j, c := range batch {
			g.Expect(c.ok).To(Equal(want[idx[j]]), "%s: batch of %d, item %d (pool %d)", what, len(idx), j, idx[j])
		}
	}
	good := func() int {
		for {
			if i := rng.IntN(len(pool)); want[i] {
				return i
			}
		}
	}
	// Each refused signature alone among good ones, where the batch equation alone decides.
	for i := range pool {
		if want[i] {
			continue
		}
		idx := []int{i}
		for range 1 + rng.IntN(8) {
			idx = append(idx, good())
		}
		rng.Shuffle(len(idx), func(a, b int) { idx[a], idx[b] = idx[b], idx[a] })
		check(fmt.Sprintf("refused %d among good", i), idx)
	}
	for round := range 300 {
		idx := make([]int, 1+rng.IntN(24))
		for j := range idx {
			if round%3 == 0 { // only good signatures: no fallback
				idx[j] = good()
			} else {
				idx[j] = rng.IntN(len(pool))
			}
		}
		check(fmt.Sprintf("round %d", round), idx)
	}
}

// The documented difference: R moved by a point of small order. Only the key's holder can sign
// so; a batch accepts it, ed25519.Verify does not.
func TestABatchUsesTheCofactoredEquation(t *testing.T) {
	g := NewWithT(t)
	k := newTestKey(3)
	r, _ := new(edwards25519.Scalar).SetUniformBytes(bytesOf(7, 64))
	msg := []byte("kds1.torsion")
	sig := k.signWithR(msg, r, order8())
	g.Expect(ed25519.Verify(k.vk.pub, msg, sig)).To(BeFalse())
	good := ed25519.Sign(k.priv, []byte("kds1.good"))
	batch := []*sigCheck{{key: k.vk, msg: msg, sig: sig}, {key: k.vk, msg: []byte("kds1.good"), sig: good}}
	verifyBatch(batch)
	g.Expect(batch[0].ok).To(BeTrue())
	g.Expect(batch[1].ok).To(BeTrue())
}

// Signatures that queue while one is checked are checked in batches of up to maxBatch, each
// waiter gets its own answer, and the lead passes on until the queue is empty.
func TestSignaturesThatArriveTogetherAreCheckedTogether(t *testing.T) {
	g := NewWithT(t)
	pool := signatures(t)
	var sizes []int
	b := &batcher{onBatch: func(n int) { sizes = append(sizes, n) }} // one leader at a time: no race
	b.leading = true                                                 // as if a check were under way
	const waiters = 100
	got := make([]bool, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			c := *pool[i%len(pool)]
			got[i] = b.check(&c)
		})
	}
	g.Eventually(func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) }, 10*time.Second).Should(Equal(waiters))
	b.mu.Lock()
	b.leading = false // the check under way ends: the next to arrive leads
	b.mu.Unlock()
	first := *pool[0]
	g.Expect(b.check(&first)).To(BeTrue())
	wg.Wait()
	g.Expect(sizes).To(Equal([]int{maxBatch, waiters + 1 - maxBatch}))
	for i := range waiters {
		c := pool[i%len(pool)]
		g.Expect(got[i]).To(Equal(ed25519.Verify(c.key.pub, c.msg, c.sig)), "waiter %d", i)
	}
	g.Expect(b.leading).To(BeFalse())
	g.Expect(b.queue).To(BeEmpty())
}

func TestConcurrentVerifiesEachGetTheirOwnClaims(t *testing.T) {
	g := NewWithT(t)
	k, err := NewKeys()
	g.Expect(err).NotTo(HaveOccurred())
	now := time.Unix(1_800_000_000, 0)
	const n = 200
	toks := make([]string, n)
	for i := range toks {
		toks[i], err = k.Issue(Claims{Kind: KindZone, Name: fmt.Sprintf("zone-%d", i)}, time.Hour, now)
		g.Expect(err).NotTo(HaveOccurred())
		if i%5 == 0 { // a bad signature among good ones
			b := []byte(toks[i])
			b[len(b)-3] ^= 1
			toks[i] = string(b)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	names := make([]string, n)
	for i := range toks {
		wg.Go(func() {
			c, err := k.Verify(toks[i], now)
			names[i], errs[i] = c.Name, err
		})
	}
	wg.Wait()
	for i := range toks {
		if i%5 == 0 {
			g.Expect(errs[i]).To(HaveOccurred(), "token %d", i)
			continue
		}
		g.Expect(errs[i]).NotTo(HaveOccurred(), "token %d", i)
		g.Expect(names[i]).To(Equal(fmt.Sprintf("zone-%d", i)))
	}
}

// BenchmarkVerify: one token at a time, against a burst of them from many goroutines at once
// (zones reconnecting together), which the batcher checks in batches.
func BenchmarkVerify(b *testing.B) {
	k, _ := NewKeys()
	now := time.Unix(1_800_000_000, 0)
	tok, _ := k.Issue(Claims{Kind: KindZone, Name: "zone-1"}, time.Hour, now)
	b.Run("alone", func(b *testing.B) {
		for b.Loop() {
			if _, err := k.Verify(tok, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("burst", func(b *testing.B) {
		b.SetParallelism(64)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := k.Verify(tok, now); err != nil {
					b.Error(err)
				}
			}
		})
	})
}

// BenchmarkVerifyBatch: the CPU of one signature in a batch of each size (good signatures of
// one key, as a fleet's tokens are), against checking it alone.
func BenchmarkVerifyBatch(b *testing.B) {
	k := newTestKey(1)
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64} {
		batch := make([]*sigCheck, n)
		for i := range batch {
			msg := []byte(fmt.Sprintf("kds1.token-%d", i))
			batch[i] = &sigCheck{key: k.vk, msg: msg, sig: ed25519.Sign(k.priv, msg)}
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				verifyBatch(batch)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "us/signature")
		})
	}
}

package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"sync"

	"filippo.io/edwards25519"
)

// verifyKey is a key that verifies tokens, with its point decoded once.
type verifyKey struct {
	pub   ed25519.PublicKey
	point *edwards25519.Point
}

// sigCheck is one signature waiting to be checked.
type sigCheck struct {
	key      *verifyKey
	msg, sig []byte
	ok       bool          // set before done is closed
	lead     bool          // set before done is closed: the waiter checks the next batch
	done     chan struct{} // closed once ok (or lead) is set
}

// maxBatch bounds a batch: past a few dozen signatures a batch costs no less per signature, and
// the last of a batch waits for all of it.
const maxBatch = 64

// batcher checks the signatures that arrive together in batches, at about a quarter of the CPU
// of checking each alone (a thousand zones reconnecting at once pay one Ed25519 check each).
// It owns no goroutine: one caller at a time leads, checking its own signature with those that
// queued meanwhile, then hands the lead to the first that queued after them. A signature that
// arrives alone is checked alone, at once.
type batcher struct {
	mu      sync.Mutex // guards leading and queue
	leading bool
	queue   []*sigCheck
	onBatch func(n int) // tests: called with each batch's size
}

// check reports whether c.sig is c.key's signature of c.msg, as ed25519.Verify does (but for
// the one difference verifyBatch names).
func (b *batcher) check(c *sigCheck) bool {
	b.mu.Lock()
	if b.leading {
		c.done = make(chan struct{})
		b.queue = append(b.queue, c)
		b.mu.Unlock()
		<-c.done
		if !c.lead {
			return c.ok
		}
		b.mu.Lock() // handed the lead, which stays taken
	}
	b.leading = true
	n := min(len(b.queue), maxBatch-1)
	batch := append(make([]*sigCheck, 0, n+1), c)
	batch = append(batch, b.queue[:n]...)
	b.queue = b.queue[n:]
	b.mu.Unlock()

	verifyBatch(batch)
	if b.onBatch != nil {
		b.onBatch(len(batch))
	}

	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue[0]
		b.queue = b.queue[1:]
		next.lead = true
		close(next.done)
	} else {
		b.leading = false
		b.queue = nil // let a burst's backing array go
	}
	b.mu.Unlock()
	for _, o := range batch[1:] {
		close(o.done)
	}
	return c.ok
}

// verifyBatch sets each check's ok. It checks all of them in one multi-scalar multiplication
// (the randomized batch equation of Bernstein et al., "High-speed high-security signatures",
// section 5), and each alone only when that fails, to find which.
//
// A batch accepts what ed25519.Verify accepts, except that its equation is the cofactored one: it
// also accepts a signature whose R differs from the one ed25519.Verify wants by a point of small
// order. Only the key's holder can make such a signature (S still has to match R's hash), so it
// proves the same thing; and a random 128-bit coefficient per signature leaves a forged batch a
// 2^-128 chance.
func verifyBatch(batch []*sigCheck) {
	if len(batch) == 1 {
		c := batch[0]
		c.ok = ed25519.Verify(c.key.pub, c.msg, c.sig)
		return
	}
	zs := make([]byte, 16*len(batch))
	rand.Read(zs) // never fails (crypto/rand's contract since Go 1.24)
	scalars := make([]*edwards25519.Scalar, 0, len(batch)+2)
	points := make([]*edwards25519.Point, 0, len(batch)+2)
	sumS := edwards25519.NewScalar() // sum of z*S, for the base point
	var keys []*verifyKey            // each distinct key, with sum of z*k in keySums
	var keySums []*edwards25519.Scalar
	h := sha512.New()
	var wide [64]byte
	valid := 0
	for i, c := range batch {
		c.ok = false
		R, S := decodeSig(c.sig)
		if R == nil {
			continue // what ed25519.Verify refuses before any arithmetic
		}
		h.Reset()
		h.Write(c.sig[:32])
		h.Write(c.key.pub)
		h.Write(c.msg)
		k, _ := new(edwards25519.Scalar).SetUniformBytes(h.Sum(wide[:0]))
		copy(wide[:], zs[16*i:16*i+16])
		clear(wide[16:])
		z, _ := new(edwards25519.Scalar).SetUniformBytes(wide[:])
		sumS.MultiplyAdd(z, S, sumS)
		j := 0
		for j < len(keys) && keys[j] != c.key {
			j++
		}
		if j == len(keys) {
			keys = append(keys, c.key)
			keySums = append(keySums, edwards25519.NewScalar())
		}
		keySums[j].MultiplyAdd(z, k, keySums[j])
		scalars = append(scalars, z)
		points = append(points, R)
		c.ok = true // until the equation says otherwise
		valid++
	}
	if valid == 0 {
		return
	}
	// [8]( sum z*R + sum (z*k)*A - (sum z*S)*B ) must be the identity.
	scalars = append(scalars, sumS.Negate(sumS))
	points = append(points, edwards25519.NewGeneratorPoint())
	for j, key := range keys {
		scalars = append(scalars, keySums[j])
		points = append(points, key.point)
	}
	p := new(edwards25519.Point).VarTimeMultiScalarMult(scalars, points)
	if p.MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return
	}
	for _, c := range batch {
		if c.ok {
			c.ok = ed25519.Verify(c.key.pub, c.msg, c.sig)
		}
	}
}

// decodeSig returns a signature's R and S, or nils where ed25519.Verify would refuse it
// whatever the message: an S not below the group's order, or an R that is no canonical encoding
// of a point (ed25519.Verify compares R's bytes with a canonical encoding, which these never are).
func decodeSig(sig []byte) (*edwards25519.Point, *edwards25519.Scalar) {
	if len(sig) != ed25519.SignatureSize || !canonicalPoint(sig[:32]) {
		return nil, nil
	}
	S, err := new(edwards25519.Scalar).SetCanonicalBytes(sig[32:])
	if err != nil {
		return nil, nil
	}
	R, err := new(edwards25519.Point).SetBytes(sig[:32])
	if err != nil {
		return nil, nil
	}
	return R, S
}

// canonicalPoint reports whether b, read as a point by edwards25519's SetBytes, is the encoding
// that point's Bytes gives back. SetBytes also takes a y of p = 2^255-19 or more, and x = 0 (y is
// 1 or p-1) with the sign bit set.
func canonicalPoint(b []byte) bool {
	var y [32]byte
	copy(y[:], b)
	sign := y[31] >> 7
	y[31] &= 0x7f
	// y >= p: the top byte 0x7f, the middle all 0xff, the lowest at least 0xed.
	high := y[31] == 0x7f
	for _, v := range y[1:31] {
		high = high && v == 0xff
	}
	if high && y[0] >= 0xed {
		return false
	}
	if sign == 0 {
		return true
	}
	// y = 1 or y = p-1 = 2^255-20 (0xec, 0xff..., 0x7f): x = 0, whose sign bit must be clear.
	one := y[0] == 1 && y[31] == 0
	for _, v := range y[1:31] {
		one = one && v == 0
	}
	return !one && !(high && y[0] == 0xec)
}

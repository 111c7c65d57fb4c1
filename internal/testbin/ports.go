package testbin

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreePortBase returns a port base such that base+off is free on 127.0.0.1 now for every
// offset, for scripts that lay their ports out from one --port-base. The base is picked at
// random so that two checkouts running their tests at once on one machine do not collide.
func FreePortBase(t testing.TB, offsets ...int) int {
	t.Helper()
	for range 100 {
		base := 20000 + rand.IntN(30000)
		if allFree(base, offsets) {
			return base
		}
	}
	t.Fatal("no free port base found")
	return 0
}

func allFree(base int, offsets []int) bool {
	for _, off := range offsets {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+off))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

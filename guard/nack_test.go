package guard

import (
	"testing"

	. "github.com/onsi/gomega"
)

// The names a NACK's message gives, in grpc-go's and Envoy's forms; a name that is only part of
// another is not taken for it.
func TestRefusedNames(t *testing.T) {
	g := NewWithT(t)
	names := []string{"a", "b", "c1", "c10", "out|80||svc", "name"}
	for _, tc := range []struct {
		msg  string
		want []string
	}{
		{`error parsing "ClusterResource" response: resource "b": unexpected lbPolicy MAGLEV in response: name:"b"`, []string{"b"}},
		{"error parsing \"ClusterResource\" response: resource \"a\": bad;\nresource \"c10\": worse", []string{"a", "c10"}},
		{"Error adding/updating cluster(s) c10: unknown, out|80||svc: bad", []string{"c10", "out|80||svc"}},
		{"Error adding/updating listener(s) c1: duplicate (c10: also)", []string{"c1", "c10"}},
		{"something went wrong", nil},
		{`unterminated "a`, nil},
	} {
		g.Expect(refusedNames(tc.msg, names)).To(Equal(tc.want), tc.msg)
	}
}

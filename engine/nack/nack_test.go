package nack

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/kds-host/kds-host/engine/event"
	kdsv1 "github.com/kds-host/kds-host/proto/kds/v1"
)

func names(rs []event.Rejection) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	return out
}

func carriedOf(ns ...string) []Carried {
	out := make([]Carried, len(ns))
	for i, n := range ns {
		out[i] = Carried{Name: n, Version: "v" + n, New: true}
	}
	return out
}

// The names a NACK's message gives, in grpc-go's and Envoy's forms; a name that is only part of
// another is not taken for it, and one named twice is refused once.
func TestReadFromMessage(t *testing.T) {
	g := NewWithT(t)
	carried := carriedOf("a", "b", "c1", "c10", "name", "out|80||svc")
	for _, tc := range []struct {
		msg  string
		want []string
	}{
		{`error parsing "ClusterResource" response: resource "b": unexpected lbPolicy MAGLEV in response: name:"b"`, []string{"b"}},
		{"error parsing \"ClusterResource\" response: resource \"a\": bad;\nresource \"c10\": worse", []string{"a", "c10"}},
		{"Error adding/updating cluster(s) c10: unknown, out|80||svc: bad", []string{"c10", "out|80||svc"}},
		{"Error adding/updating listener(s) c1: duplicate (c10: also)", []string{"c1", "c10"}},
	} {
		rs, _ := Read(&rpcstatus.Status{Message: tc.msg}, carried, 4096, event.CauseInvalid)
		g.Expect(names(rs)).To(Equal(tc.want), tc.msg)
		for _, r := range rs {
			g.Expect(r.Cause).To(Equal(event.CauseInvalid))
			g.Expect(r.Version).To(Equal("v" + r.Name))
		}
	}
	rs, _ := Read(&rpcstatus.Status{Message: `resource "b": too big;` + "\n" + `resource "a": no`}, carried, 4096, event.CauseInvalid)
	g.Expect(rs[0].Reason).To(Equal("no"))
	g.Expect(rs[1].Reason).To(Equal("too big"))
}

// A message that names none of them refuses what the response brought new, else all of it.
func TestReadNamesNone(t *testing.T) {
	g := NewWithT(t)
	carried := []Carried{{Name: "a", Version: "1"}, {Name: "b", Version: "2", New: true}}
	for _, msg := range []string{"something went wrong", `unterminated "a`} {
		rs, kept := Read(&rpcstatus.Status{Message: msg}, carried, 4096, event.CauseUnspecified)
		g.Expect(names(rs)).To(Equal([]string{"b"}), msg)
		g.Expect(rs[0].Reason).To(Equal(msg))
		g.Expect(kept).To(Equal(msg))
	}
	carried[1].New = false
	rs, _ := Read(&rpcstatus.Status{Message: "no"}, carried, 4096, event.CauseUnspecified)
	g.Expect(names(rs)).To(Equal([]string{"a", "b"}))
}

// What a SotW full state carried again is refused when the NACK names it (the message or the
// structured list), and never when it names nothing carried: then what the response brought new,
// else what it brought.
func TestReadCarriedAgain(t *testing.T) {
	g := NewWithT(t)
	carried := []Carried{{Name: "bad", Version: "1", Again: true}, {Name: "good", Version: "2", New: true}, {Name: "same", Version: "3"}}
	rs, _ := Read(&rpcstatus.Status{Message: `resource "bad": unexpected lbPolicy MAGLEV`}, carried, 4096, event.CauseInvalid)
	g.Expect(names(rs)).To(Equal([]string{"bad"}))
	g.Expect(rs[0].Version).To(Equal("1"))
	d, err := Detail(&kdsv1.RejectionList{Rejections: []*kdsv1.Rejection{{Name: "bad"}}}, "no")
	g.Expect(err).NotTo(HaveOccurred())
	rs, _ = Read(d, carried, 4096, event.CauseInvalid)
	g.Expect(names(rs)).To(Equal([]string{"bad"}))
	rs, _ = Read(&rpcstatus.Status{Message: "something went wrong"}, carried, 4096, event.CauseInvalid)
	g.Expect(names(rs)).To(Equal([]string{"good"}))
	carried[1].New = false
	rs, _ = Read(&rpcstatus.Status{Message: "something went wrong"}, carried, 4096, event.CauseInvalid)
	g.Expect(names(rs)).To(Equal([]string{"good", "same"}))
}

// kds-host's structured detail wins over the message: its causes and missing owners are read;
// a name not carried, or named again, is left out; the order is the response's.
func TestReadStructured(t *testing.T) {
	g := NewWithT(t)
	list := &kdsv1.RejectionList{Kind: "MeshTimeout", Rejections: []*kdsv1.Rejection{
		{Name: "b", Reason: "webhook not ready", Cause: kdsv1.Cause_CAUSE_TRANSIENT},
		{Name: "a", Reason: "no mesh", MissingOwner: &kdsv1.ResourceKey{Kind: "Mesh", Name: "default"}},
		{Name: "b", Reason: "again"},
		{Name: "not-sent", Cause: kdsv1.Cause_CAUSE_INVALID},
		{Name: "c", Cause: kdsv1.Cause(99)},
	}}
	detail, err := Detail(list, `resource "c": ignored`)
	g.Expect(err).NotTo(HaveOccurred())
	rs, _ := Read(detail, carriedOf("a", "b", "c"), 4096, event.CauseInvalid)
	g.Expect(rs).To(Equal([]event.Rejection{
		{Name: "a", Version: "va", Reason: "no mesh", Cause: event.CauseMissingOwner, MissingOwner: "Mesh/default"},
		{Name: "b", Version: "vb", Reason: "webhook not ready", Cause: event.CauseTransient},
		{Name: "c", Version: "vc", Cause: event.CauseUnspecified},
	}))
}

// What is kept is bounded, on a rune boundary.
func TestReadBounds(t *testing.T) {
	g := NewWithT(t)
	msg := `resource "a": ` + strings.Repeat("é", 100_000)
	rs, kept := Read(&rpcstatus.Status{Message: msg}, carriedOf("a"), 1024, event.CauseInvalid)
	g.Expect(len(kept)).To(BeNumerically("<=", 1024))
	g.Expect(len(rs[0].Reason)).To(BeNumerically("<=", 256))
	g.Expect(kept).To(HaveSuffix("... (truncated)"))
	g.Expect(strings.ToValidUTF8(kept, "?")).To(Equal(kept))
}

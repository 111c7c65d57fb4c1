package engine

import (
	"testing"

	. "github.com/onsi/gomega"
)

type seqView struct {
	seq     uint64
	visible bool
}

func (v seqView) Visible(*Entry) bool    { return v.visible }
func (v seqView) None() bool             { return false }
func (v seqView) SeesAll(*Snapshot) bool { return false }
func (v seqView) Seq() uint64            { return v.seq }

// Views of a zone published out of order (a check's and a new stream's, from two goroutines):
// the session keeps the latest.
func TestASessionKeepsTheLatestViewPublished(t *testing.T) {
	g := NewWithT(t)
	s := newSession(NewCache([]string{"Mesh"}), 1, nil, false)
	s.publish(seqView{seq: 2, visible: true})
	s.publish(seqView{seq: 1, visible: false})
	g.Expect(s.view.Load().View.Seq()).To(Equal(uint64(2)))
	s.publish(seqView{seq: 3, visible: false})
	g.Expect(s.view.Load().View.Seq()).To(Equal(uint64(3)))
}

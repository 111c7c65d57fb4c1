package engine

import (
	"testing"
)

// A write's fan-out sends the streams of one connection back to back (grpc-go's writer then
// flushes them together), and its list follows the streams that open and close.
func TestTheFanOutGroupsAConnectionsStreams(t *testing.T) {
	c := NewCache([]string{"a"})
	defer c.Close()
	conns := []string{"10.0.0.2:4000", "10.0.0.1:5000", "10.0.0.3:6000"}
	for id := range int64(9) {
		c.openSession(id, &streamInfo{conn: conns[id%3], close: func(error) {}, loop: true}, false)
	}
	c.SetSnapshot(&Snapshot{})
	order := c.order
	if len(order) != 9 {
		t.Fatalf("the fan-out lists %d streams, want 9", len(order))
	}
	seen := map[string]bool{}
	for i, st := range order {
		if i > 0 && order[i-1].info.conn != st.info.conn && seen[st.info.conn] {
			t.Fatalf("stream %d of %s comes after another connection's: %v", st.id, st.info.conn, ids(order))
		}
		seen[st.info.conn] = true
	}

	c.closeStream(4)
	c.SetSnapshot(&Snapshot{})
	if len(c.order) != 8 {
		t.Fatalf("after a stream closed the fan-out lists %d streams, want 8: %v", len(c.order), ids(c.order))
	}
	for _, st := range c.order {
		if st.id == 4 {
			t.Fatalf("the closed stream is still in the fan-out: %v", ids(c.order))
		}
	}
}

func ids(sts []*Session) []int64 {
	var out []int64
	for _, st := range sts {
		out = append(out, st.id)
	}
	return out
}

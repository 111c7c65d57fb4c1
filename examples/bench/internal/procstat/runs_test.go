package procstat

import (
	"slices"
	"testing"
)

// Each run starts a block's jobs one further along, and keeps the blocks in order.
func TestRunsRotateTheJobsOfEachBlock(t *testing.T) {
	blocks := [][]string{
		{"100/holds-on", "100/floor", "100/stock"},
		{"1000/holds-on", "1000/stock"},
	}
	for r, want := range map[int][]string{
		1: {"100/holds-on", "100/floor", "100/stock", "1000/holds-on", "1000/stock"},
		2: {"100/floor", "100/stock", "100/holds-on", "1000/stock", "1000/holds-on"},
		3: {"100/stock", "100/holds-on", "100/floor", "1000/holds-on", "1000/stock"},
		4: {"100/holds-on", "100/floor", "100/stock", "1000/stock", "1000/holds-on"},
	} {
		if got := RunOrder(blocks, r); !slices.Equal(got, want) {
			t.Errorf("run %d: %v, want %v", r, got, want)
		}
	}
}

// A list is read name by name; a name not known is an error naming those that are.
func TestParseListKnowsItsNames(t *testing.T) {
	type kind string
	got, err := ParseList("b, a", []kind{"a", "b"})
	if err != nil || !slices.Equal(got, []kind{"b", "a"}) {
		t.Fatalf("ParseList: %v, %v", got, err)
	}
	if _, err := ParseList("a,c", []kind{"a", "b"}); err == nil || err.Error() != `"c": want a, b` {
		t.Fatalf("ParseList of an unknown name: %v", err)
	}
}

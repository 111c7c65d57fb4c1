package guard

import (
	"strings"
)

// maxReason bounds the reason kept for one refused resource.
const maxReason = 512

// refusedNames are the names (of those a response carried) that a NACK's message names as
// refused: quoted, as grpc-go writes them (`resource "NAME": ...`), or followed by a colon, as
// Envoy does (`Error adding/updating cluster(s) NAME: ...`). None: the message names none.
func refusedNames(msg string, names []string) []string {
	var out []string
	for _, n := range names {
		if n != "" && (strings.Contains(msg, `"`+n+`"`) || namedWithColon(msg, n)) {
			out = append(out, n)
		}
	}
	return out
}

// namedWithColon reports whether msg has name followed by ':' and preceded by the start, a
// space, a comma or a parenthesis (so "c1" is not found in "c10:").
func namedWithColon(msg, name string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], name+":")
		if j < 0 {
			return false
		}
		j += i
		if j == 0 || strings.ContainsRune(" ,(\n", rune(msg[j-1])) {
			return true
		}
		i = j + 1
	}
}

// reasonFor is what msg says of name: grpc-go's text for that resource, else the whole message,
// bounded.
func reasonFor(msg, name string) string {
	r := msg
	if i := strings.Index(msg, `resource "`+name+`": `); i >= 0 {
		r = msg[i+len(`resource "`+name+`": `):]
		if j := strings.Index(r, ";\n"); j >= 0 {
			r = r[:j]
		}
	}
	if len(r) > maxReason {
		r = r[:maxReason] + "..."
	}
	return r
}

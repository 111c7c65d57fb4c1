package guard

import (
	"strings"
)

// maxReason bounds the reason kept for one refused resource.
const maxReason = 512

// refusedNames are the names (of those a response carried) that a NACK's message names as
// refused: quoted, as grpc-go writes them (`resource "NAME": ...`), or followed by a colon, as
// Envoy does (`Error adding/updating cluster(s) NAME: ...`). None: the message names none. The
// message is read once, whatever the number of names.
func refusedNames(msg string, names []string) []string {
	named := namedIn(msg)
	var out []string
	for _, n := range names {
		if n != "" && named[n] {
			out = append(out, n)
		}
	}
	return out
}

// namedIn is what msg names: every quoted string, and every word (between spaces, commas,
// parentheses or line ends) that a colon ends, without that colon.
func namedIn(msg string) map[string]bool {
	named := map[string]bool{}
	for rest := msg; ; {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i+1:], '"')
		if j < 0 {
			break
		}
		named[rest[i+1:i+1+j]] = true
		rest = rest[i+1+j+1:]
	}
	for _, w := range strings.FieldsFunc(msg, func(r rune) bool { return strings.ContainsRune(" ,(\n", r) }) {
		if name, ok := strings.CutSuffix(w, ":"); ok && name != "" {
			named[name] = true
		}
	}
	return named
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

package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/kds-host/kds-host/host/resource"
)

// SplitDocuments splits a YAML stream into its documents: a line that starts with "---" followed
// by a space, a tab or the end of the line begins a new one (what follows the marker on that line
// belongs to the new document), and a "..." line ends one. Documents holding nothing but blank
// lines and comments are dropped, so the result holds only documents with content.
func SplitDocuments(data []byte) [][]byte {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	var (
		docs [][]byte
		cur  []byte
	)
	flush := func() {
		if hasContent(cur) {
			docs = append(docs, cur)
		}
		cur = nil
	}
	r := bufio.NewReader(bytes.NewReader(data))
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			switch {
			case isMarker(line, "---"):
				flush()
				if rest := line[3:]; hasContent(rest) {
					cur = append(cur, rest...)
				}
			case isMarker(line, "..."):
				flush()
			case line[0] == '%' && !hasContent(cur):
				// A directive (%YAML, %TAG) of the document that follows.
			default:
				cur = append(cur, line...)
			}
		}
		if err != nil {
			break
		}
	}
	flush()
	return docs
}

// isMarker reports whether line starts with the document marker m followed by white space or
// the end of the line.
func isMarker(line []byte, m string) bool {
	if !bytes.HasPrefix(line, []byte(m)) {
		return false
	}
	rest := line[len(m):]
	return len(rest) == 0 || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '\r' || rest[0] == '\n'
}

// hasContent reports whether doc holds anything but blank lines and comments.
func hasContent(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return true
		}
	}
	return false
}

// DocumentJSON converts one YAML or JSON document to JSON. Duplicate keys are an error, and so
// is anything after the document's value (which the YAML to JSON conversion alone would drop).
// Before anything is built, the document is measured (see MaxNestingDepth and
// ErrExpandsTooLarge): a document of resources may nest MaxNestingDepth levels and two more (a
// list of them: {"items": [...]}), and its YAML aliases may expand it to MaxBodyBytes, or to
// its own size when that is larger.
func DocumentJSON(doc []byte) ([]byte, error) {
	return documentJSON(doc, MaxBodyBytes, MaxNestingDepth+2)
}

// documentJSON is DocumentJSON with its limits: maxBytes for what aliases expand the document
// to (or its own size when larger), maxDepth for its nesting.
func documentJSON(doc []byte, maxBytes, maxDepth int) ([]byte, error) {
	if json.Valid(doc) {
		// One JSON value and nothing after it: no aliases, so only its depth to measure.
		if at, deep := JSONTooDeep(doc, maxDepth); deep {
			return nil, fmt.Errorf("%w: more than %d levels of objects and lists (at byte %d)", ErrNestsTooDeep, maxDepth, at)
		}
		return yaml.YAMLToJSONStrict(doc)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(doc))
	var n yamlv3.Node
	if err := dec.Decode(&n); err != nil {
		if strings.Contains(err.Error(), "exceeded max depth") {
			return nil, fmt.Errorf("%w: more than %d levels of objects and lists (%v)", ErrNestsTooDeep, maxDepth, err)
		}
		return nil, err
	}
	if err := dec.Decode(&n); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("more than one document")
		}
		return nil, fmt.Errorf("content after the document: %w", err)
	}
	m := measure{maxDepth: maxDepth, anchors: map[*yamlv3.Node]size{}, busy: map[*yamlv3.Node]bool{}}
	sz, err := m.node(&n, 0)
	if err != nil {
		return nil, err
	}
	if limit := max(maxBytes, sz.written); sz.expanded > limit {
		return nil, fmt.Errorf("%w: about %d bytes once its aliases are expanded, %d written; at most %d", ErrExpandsTooLarge, sz.expanded, sz.written, limit)
	}
	return yaml.YAMLToJSONStrict(doc)
}

// MaxNestingDepth is how deep objects and lists may nest in one resource, the resource's own
// object counting one: far more than any kind needs, far less than what the KDS encoding and
// the zones' decoders refuse.
const MaxNestingDepth = 100

var (
	// ErrNestsTooDeep: a document nests objects and lists deeper than its limit.
	ErrNestsTooDeep = errors.New("nests too deep")
	// ErrExpandsTooLarge: a document's YAML aliases expand it past its limit (an alias is a
	// copy of what its anchor names, so a small document can stand for a huge one).
	ErrExpandsTooLarge = errors.New("its YAML aliases expand it past the size limit")
)

// JSONTooDeep reports whether the JSON value data nests objects and lists deeper than maxDepth,
// and at which byte it goes past. It reads data as a byte scan, building nothing: call it on
// valid JSON.
func JSONTooDeep(data []byte, maxDepth int) (at int, tooDeep bool) {
	depth, inString, escaped := 0, false, false
	for i, c := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > maxDepth {
				return i, true
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return 0, false
}

// size is what a YAML node stands for, in bytes of JSON (an estimate): expanded, with every
// alias replaced by what it names, and written, each alias counting as itself; height is how
// many levels of objects and lists it holds, itself included.
type size struct{ expanded, written, height int }

// measure walks a YAML document's nodes once, each anchor's only the first time (its size is
// kept for every alias of it): the walk costs what the document holds, not what it expands to.
type measure struct {
	maxDepth int
	anchors  map[*yamlv3.Node]size // the anchors measured so far
	busy     map[*yamlv3.Node]bool // the anchors being measured
}

// node measures n, found under depth levels of objects and lists.
func (m *measure) node(n *yamlv3.Node, depth int) (size, error) {
	switch {
	case n.Kind == yamlv3.AliasNode:
		if n.Alias == nil {
			return size{}, fmt.Errorf("line %d: alias *%s names no anchor", n.Line, n.Value)
		}
		sz, err := m.anchored(n.Alias, depth)
		sz.written = len(n.Value) + 1
		return sz, err
	case n.Anchor != "":
		return m.anchored(n, depth)
	}
	return m.content(n, depth)
}

// anchored measures an anchor's node the first time, and checks at every use that it does not
// nest deeper than allowed there.
func (m *measure) anchored(n *yamlv3.Node, depth int) (size, error) {
	sz, ok := m.anchors[n]
	if !ok {
		if m.busy[n] {
			return size{}, fmt.Errorf("line %d: anchor &%s holds an alias of itself", n.Line, n.Anchor)
		}
		m.busy[n] = true
		var err error
		sz, err = m.content(n, depth)
		delete(m.busy, n)
		if err != nil {
			return size{}, err
		}
		m.anchors[n] = sz
	}
	if depth+sz.height > m.maxDepth {
		return size{}, fmt.Errorf("%w: more than %d levels of objects and lists (an alias of &%s, line %d)", ErrNestsTooDeep, m.maxDepth, n.Anchor, n.Line)
	}
	return sz, nil
}

// content measures n's own content.
func (m *measure) content(n *yamlv3.Node, depth int) (size, error) {
	switch n.Kind {
	case yamlv3.ScalarNode:
		l := len(n.Value) + 2 // quoted, or a separator
		return size{expanded: l, written: l}, nil
	case yamlv3.DocumentNode:
		var sz size
		for _, c := range n.Content {
			csz, err := m.node(c, depth)
			if err != nil {
				return size{}, err
			}
			sz = sz.plus(csz, 0)
		}
		return sz, nil
	case yamlv3.MappingNode, yamlv3.SequenceNode:
		if depth+1 > m.maxDepth {
			return size{}, fmt.Errorf("%w: more than %d levels of objects and lists (line %d, column %d)", ErrNestsTooDeep, m.maxDepth, n.Line, n.Column)
		}
		sz := size{expanded: 2, written: 2}
		for _, c := range n.Content {
			csz, err := m.node(c, depth+1)
			if err != nil {
				return size{}, err
			}
			sz = sz.plus(csz, 1)
		}
		sz.height++
		return sz, nil
	}
	return size{}, nil
}

// plus adds o, and sep bytes between, to sz; the expanded size saturates rather than overflows.
func (sz size) plus(o size, sep int) size {
	const most = 1 << 50
	return size{
		expanded: min(sz.expanded+o.expanded+sep, most),
		written:  sz.written + o.written + sep,
		height:   max(sz.height, o.height),
	}
}

// MaxBodyBytes is the largest request body a PUT accepts.
const MaxBodyBytes = 4 << 20

// decodeResource reads one resource document (JSON or YAML) from a request body. Unknown fields
// are errors; the returned *Error names the field at fault.
func decodeResource(w http.ResponseWriter, req *http.Request) (resource.Resource, *Error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxBodyBytes))
	if err != nil {
		if _, ok := err.(*http.MaxBytesError); ok {
			return resource.Resource{}, &Error{Status: http.StatusRequestEntityTooLarge, Title: titleTooLarge,
				Details: fmt.Sprintf("body: larger than %d bytes", MaxBodyBytes)}
		}
		return resource.Resource{}, fieldError("body", "cannot be read: %v", err)
	}
	return DecodeResource(body)
}

// DecodeResource decodes one resource document, JSON or YAML. Unknown fields are errors; the
// returned *Error (status 400) names the field at fault. A document nesting deeper than
// MaxNestingDepth is a 400; one whose YAML aliases expand it past MaxBodyBytes is a 413, refused
// before the aliases are expanded.
func DecodeResource(doc []byte) (resource.Resource, *Error) {
	var r resource.Resource
	docs := SplitDocuments(doc)
	switch len(docs) {
	case 0:
		return r, fieldError("body", "is empty: send one resource as JSON or YAML")
	case 1:
	default:
		return r, fieldError("body", "holds %d documents: send one resource (kds-host apply takes several)", len(docs))
	}
	j, err := documentJSON(docs[0], MaxBodyBytes, MaxNestingDepth)
	switch {
	case errors.Is(err, ErrExpandsTooLarge):
		return r, &Error{Status: http.StatusRequestEntityTooLarge, Title: titleTooLarge,
			Details: fmt.Sprintf("body: %v (the limit of a body): write the repeated parts out, or use fewer aliases", err)}
	case errors.Is(err, ErrNestsTooDeep):
		return r, fieldError("body", "%v", err)
	case err != nil:
		return r, fieldError("body", "is not valid YAML or JSON: %v", err)
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
		return r, fieldError("body", "must be an object, not null")
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return resource.Resource{}, fromDecode(err)
	}
	if dec.More() {
		return resource.Resource{}, fieldError("body", "holds more than one JSON value: send one resource")
	}
	return r, nil
}

package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

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
func DocumentJSON(doc []byte) ([]byte, error) {
	dec := yamlv3.NewDecoder(bytes.NewReader(doc))
	var n yamlv3.Node
	if err := dec.Decode(&n); err != nil {
		return nil, err
	}
	if err := dec.Decode(&n); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("more than one document")
		}
		return nil, fmt.Errorf("content after the document: %w", err)
	}
	return yaml.YAMLToJSONStrict(doc)
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
// returned *Error (status 400) names the field at fault.
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
	j, err := DocumentJSON(docs[0])
	if err != nil {
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

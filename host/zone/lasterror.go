package zone

import (
	"io/fs"
	"strings"
)

// publicError is err's message as the zone's open answers show it (Stats.LastError, served
// without a token): without file paths. The files the zone was configured with are named by
// their flags, and any other path an *fs.PathError carries is left out; the log keeps err whole.
func (c *Client) publicError(err error) string {
	msg := err.Error()
	files := []struct{ path, name string }{
		{c.cfg.TokenFile, "the zone token file (--zone-token-file)"},
		{c.cfg.TLSCAFile, "its CA file"}, // tlsHint names the flag
		{c.cfg.ClientCertFile, "the client certificate file (--kds-tls-client-cert)"},
		{c.cfg.ClientKeyFile, "the client key file (--kds-tls-client-key)"},
	}
	for _, f := range files {
		msg = replacePath(msg, f.path, f.name)
	}
	for _, pe := range pathErrors(err) {
		msg = replacePath(msg, pe.Path, "a file")
	}
	return msg
}

// pathErrors returns every *fs.PathError in err's tree.
func pathErrors(err error) []*fs.PathError {
	var out []*fs.PathError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if pe, ok := err.(*fs.PathError); ok {
			out = append(out, pe)
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// replacePath replaces each occurrence of path in msg that stands as a word of its own (not
// inside a longer path or word) with name.
func replacePath(msg, path, name string) string {
	if path == "" {
		return msg
	}
	var b strings.Builder
	for {
		i := strings.Index(msg, path)
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		end := i + len(path)
		if boundary(msg, i-1) && boundary(msg, end) {
			b.WriteString(msg[:i])
			b.WriteString(name)
		} else {
			b.WriteString(msg[:end])
		}
		msg = msg[end:]
	}
}

// boundary reports whether msg[i] is outside msg, or a character that ends a path in the zone's
// messages: white space, a quote, a bracket, a colon, a comma, a semicolon, or a full stop
// that ends a sentence.
func boundary(msg string, i int) bool {
	switch {
	case i < 0 || i >= len(msg):
		return true
	case msg[i] == '.':
		return i+1 == len(msg) || msg[i+1] == ' '
	}
	return strings.IndexByte(" \t\n\"'`():,;", msg[i]) >= 0
}

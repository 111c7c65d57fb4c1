package controlplane

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

// ui holds the status pages: plain HTML, CSS and scripts, served as they are (no build step).
//
//go:embed ui
var ui embed.FS

// statusCSP is the Content-Security-Policy of every status page file: scripts, styles and
// data calls from this origin only, no inline script or style, no form posting anywhere, no
// framing.
const statusCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'none'; base-uri 'none'; frame-ancestors 'none'"

// The status pages, by the mode of the control plane that serves them.
const (
	pageGlobal = "global"
	pageZone   = "zone"
)

// StatusPageConfig is what a status page reads first, GET /gui/config.json (no token needed,
// it holds no secret): which page it is and whether its data calls need a token.
type StatusPageConfig struct {
	Mode string `json:"mode"`
	Auth bool   `json:"auth"`
	// TokenHint says where a token comes from, for the page's token form.
	TokenHint string `json:"tokenHint,omitempty"`
}

// isStatusPath says whether a request is for the status page's own files, which are served
// without a token (the page's data calls carry one).
func isStatusPath(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		(r.URL.Path == "/gui" || strings.HasPrefix(r.URL.Path, "/gui/"))
}

// withStatusPage serves the status page at /gui (and its files under /gui/) in front of the
// API next, and sends a browser asking for / (Accept: text/html) there; / still answers JSON
// to the CLI and any other client.
func withStatusPage(cfg StatusPageConfig, next http.Handler) http.Handler {
	page := cfg.Mode + ".html"
	conf, _ := json.Marshal(cfg)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			w.Header().Add("Vary", "Accept")
			if wantsHTML(r.Header.Get("Accept")) {
				http.Redirect(w, r, "/gui", http.StatusSeeOther)
				return
			}
		}
		if !isStatusPath(r) {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", statusCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/gui"), "/")
		switch name {
		case "", "index.html":
			name = page
		case "config.json":
			h.Set("Content-Type", "application/json")
			w.Write(conf)
			return
		}
		body, err := fs.ReadFile(ui, "ui/"+name)
		if err != nil || strings.Contains(name, "/") || strings.HasSuffix(name, ".html") && name != page {
			http.Error(w, "no such file of the status page: "+r.URL.Path, http.StatusNotFound)
			return
		}
		h.Set("Content-Type", contentType(path.Ext(name)))
		if r.Method == http.MethodGet {
			w.Write(body)
		}
	})
}

// wantsHTML says whether an Accept header asks for HTML before JSON, as a browser's does.
func wantsHTML(accept string) bool {
	html := strings.Index(accept, "text/html")
	if html < 0 {
		return false
	}
	js := strings.Index(accept, "application/json")
	return js < 0 || html < js
}

func contentType(ext string) string {
	switch ext {
	case ".html":
		return "text/html; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

// statusPage is the global's status page in front of its API handler h.
func (g *Global) statusPage(h http.Handler) http.Handler {
	cfg := StatusPageConfig{Mode: pageGlobal, Auth: g.cfg.Keys != nil}
	if cfg.Auth {
		// No path: this answer needs no token (the global's machine knows its --data-dir).
		cfg.TokenHint = "a user token (read-only is enough): on the global's machine the admin token is <data-dir>/admin.token"
		cfg.TokenHint += "; an admin mints more with `kds-host token user --name NAME --group read-only`"
	}
	return withStatusPage(cfg, h)
}

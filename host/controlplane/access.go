package controlplane

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kds-host/kds-host/engine/event"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/auth"
)

// StoreIDHeader is the KDS stream's header metadata that carries the global's store id.
const StoreIDHeader = "kds-store-id"

// apiHandler is the API and the status page behind the access rule: with Keys, every route
// but GET / and the status page's own files (/gui, status.go) needs a user token; a read-only
// one may read (GET, HEAD, and POST /api/check, which changes nothing), an admin one may do
// everything.
func (g *Global) apiHandler() http.Handler {
	h := g.statusPage(g.API.Handler())
	if g.cfg.Keys == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" && r.Method == http.MethodGet || isStatusPath(r) {
			h.ServeHTTP(w, r)
			return
		}
		c, err := g.user(r)
		if err != nil {
			api.WriteError(w, err.(*api.Error))
			return
		}
		reads := r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodPost && r.URL.Path == "/api/check"
		if !c.InGroup(auth.GroupAdmin) && !(reads && c.InGroup(auth.GroupReadOnly)) {
			api.WriteError(w, &api.Error{Status: http.StatusForbidden, Title: "Forbidden",
				Details: fmt.Sprintf("user %q (groups %s) may only read; %s %s needs a token of the %s group", c.Name, strings.Join(c.Groups, ","), r.Method, r.URL.Path, auth.GroupAdmin)})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// user checks the request's user token, or returns the 401 that says how to get one.
func (g *Global) user(r *http.Request) (auth.Claims, error) {
	hint := "this API needs a token: on the global's machine the CLI reads the admin token from " +
		"<data-dir>/" + auth.AdminTokenFile + " by itself (give --data-dir if the global runs with another); " +
		"elsewhere pass --token-file FILE or KDS_TOKEN; an admin mints more with `kds-host token user --name NAME --group read-only`"
	h := r.Header.Get("Authorization")
	if h == "" {
		return auth.Claims{}, &api.Error{Status: http.StatusUnauthorized, Title: "Unauthorized", Details: hint}
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return auth.Claims{}, &api.Error{Status: http.StatusUnauthorized, Title: "Unauthorized", Details: "the Authorization header must be `Bearer TOKEN`; " + hint}
	}
	c, err := g.cfg.Keys.Verify(strings.TrimSpace(tok), time.Now())
	if err != nil {
		return auth.Claims{}, &api.Error{Status: http.StatusUnauthorized, Title: "Unauthorized", Details: fmt.Sprintf("token refused: %v; %s", err, hint)}
	}
	if c.Kind != auth.KindUser {
		return auth.Claims{}, &api.Error{Status: http.StatusForbidden, Title: "Forbidden", Details: fmt.Sprintf("a %s token is for a zone's KDS stream, not for the API", c.Kind)}
	}
	return c, nil
}

// TokenRequest asks for a token: POST /api/tokens/zone or /api/tokens/user (admin only).
type TokenRequest struct {
	Name   string   `json:"name"`
	Groups []string `json:"groups,omitempty"`
	// ValidFor is a duration ("24h"); empty never expires.
	ValidFor string `json:"validFor,omitempty"`
}

// TokenResponse is a minted token.
type TokenResponse struct {
	Token   string     `json:"token"`
	Kind    string     `json:"kind"`
	Name    string     `json:"name"`
	Expires *time.Time `json:"expires,omitempty"`
}

func (g *Global) serveToken(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if g.cfg.Keys == nil {
			api.WriteError(w, &api.Error{Status: http.StatusNotFound, Title: "No tokens", Details: "this global runs without authentication: it has no keys to sign tokens with"})
			return
		}
		var req TokenRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad token request", Details: err.Error()})
			return
		}
		var validFor time.Duration
		if req.ValidFor != "" {
			d, err := time.ParseDuration(req.ValidFor)
			if err != nil || d <= 0 {
				api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad token request", Details: fmt.Sprintf("validFor %q: want a positive duration, e.g. 24h", req.ValidFor)})
				return
			}
			validFor = d
		}
		if kind == auth.KindZone && len(req.Groups) > 0 {
			api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad token request", Details: "a zone token has no groups"})
			return
		}
		if kind == auth.KindUser && len(req.Groups) == 0 {
			api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad token request", Details: fmt.Sprintf("groups: give %s or %s", auth.GroupReadOnly, auth.GroupAdmin)})
			return
		}
		now := time.Now()
		tok, err := g.cfg.Keys.Issue(auth.Claims{Kind: kind, Name: req.Name, Groups: req.Groups}, validFor, now)
		if err != nil {
			api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Bad token request", Details: err.Error()})
			return
		}
		resp := TokenResponse{Token: tok, Kind: kind, Name: req.Name}
		if validFor > 0 {
			t := now.Add(validFor).UTC()
			resp.Expires = &t
		}
		g.log.Info("token issued", "kind", kind, "name", req.Name, "groups", req.Groups, "valid-for", req.ValidFor)
		api.WriteJSON(w, http.StatusOK, resp)
	}
}

// refusalLines bounds the log lines of refused streams of one reason a second.
const refusalLines = 5

// logObserver logs, at INFO, what an operator needs to know about zone streams: a zone that
// connects, leaves or is replaced, the first NACK of a kind and the kind's recovery; and, at
// WARN, refused streams (g.refusals: refusalLines a second per reason at most).
func (g *Global) logObserver() event.Observer {
	log := g.log.Named("kds")
	type streamKind struct {
		stream int64
		kind   string
	}
	var mu sync.Mutex
	failing := map[streamKind]bool{}
	var nFailing atomic.Int64 // len(failing), read without mu: an ACK while nothing fails takes no lock
	return event.Observer{
		StreamOpened: func(id int64, zone string) { log.Info("zone connected", "zone", zone, "stream", id) },
		StreamClosed: func(id int64, zone string) {
			log.Info("zone disconnected", "zone", zone, "stream", id)
			mu.Lock()
			defer mu.Unlock()
			for k := range failing {
				if k.stream == id {
					delete(failing, k)
				}
			}
			nFailing.Store(int64(len(failing)))
		},
		NACK: func(n event.NACK) {
			mu.Lock()
			first := !failing[streamKind{n.StreamID, n.TypeURL}]
			failing[streamKind{n.StreamID, n.TypeURL}] = true
			nFailing.Store(int64(len(failing)))
			mu.Unlock()
			if first {
				log.Info("zone rejects a kind", "zone", n.Node, "kind", n.TypeURL, "rejected", len(n.Rejected), "detail", n.Detail)
			}
		},
		ACK: func(a event.ACK) {
			if a.Initial || nFailing.Load() == 0 {
				return // (the stream's NACK was counted before its next ACK is heard)
			}
			mu.Lock()
			was := failing[streamKind{a.StreamID, a.TypeURL}]
			delete(failing, streamKind{a.StreamID, a.TypeURL})
			nFailing.Store(int64(len(failing)))
			mu.Unlock()
			if was {
				log.Info("zone accepts the kind again", "zone", a.Node, "kind", a.TypeURL)
			}
		},
		// Refusals are counted in kds_stream_refusals_total, each of them; the log writes a few
		// a second per reason, and then how many it left out.
		Refused: func(r event.Refusal) {
			if r.Reason == "replaced" {
				g.refusals.Log(r.Reason, slog.LevelInfo, "zone stream replaced by a newer one", "zone", r.Node, "detail", r.Detail)
				return
			}
			args := []any{"reason", r.Reason}
			if r.Node != "" {
				args = append(args, "zone", r.Node)
			}
			g.refusals.Log(r.Reason, slog.LevelWarn, "KDS stream refused", append(args, "detail", r.Detail)...)
		},
	}
}

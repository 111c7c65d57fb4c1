package controlplane

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/kds"
	"github.com/kds-host/kds-host/host/owner"
	"github.com/kds-host/kds-host/host/retry"
)

// ZoneSummary counts the zones by state, all of them whatever the filter: the first part of
// GET /api/zones.
type ZoneSummary struct {
	Zones        int `json:"zones"`
	Connected    int `json:"connected"`
	Disconnected int `json:"disconnected"`
	// Failing: the zone refused names the retry policy still works on.
	Failing int `json:"failing"`
	// Withholding: owner holds keep something from the zone.
	Withholding int `json:"withholding"`
	// GivenUp: the retry policy gave up on the zone's stream.
	GivenUp int `json:"givenUp"`
}

// ZonesAnswer is the answer of GET /api/zones: the summary of every zone, then one page of the
// zones the filter matches (Total of them), sorted by name, each with its kinds.
type ZonesAnswer struct {
	Summary ZoneSummary `json:"summary"`
	Items   []ZoneView  `json:"items"`
	Total   int         `json:"total"`
	Offset  int         `json:"offset"`
	Limit   int         `json:"limit"`
}

// The page sizes of GET /api/zones, and how many withheld resources an item lists (withheldTotal
// counts them all): the answer's size is bounded whatever the zones.
const (
	DefaultZonesLimit = 50
	MaxZonesLimit     = 1000
	maxWithheldShown  = 20
)

// zoneStates are the values of GET /api/zones?state=.
var zoneStates = []string{"connected", "disconnected", "failing", "withholding", "givenUp"}

// zoneRow is one zone as the summary and the filter see it: cheap to make for every zone.
type zoneRow struct {
	view                          ZoneView
	retry                         *retry.StreamState
	failing, withholding, givenUp bool
}

func (r zoneRow) is(state string) bool {
	switch state {
	case "connected":
		return r.view.Connected
	case "disconnected":
		return !r.view.Connected
	case "failing":
		return r.failing
	case "withholding":
		return r.withholding
	case "givenUp":
		return r.givenUp
	}
	return true
}

// serveZones serves GET /api/zones: ?state= (connected, disconnected, failing, withholding,
// givenUp), ?zone= (a part of the name), ?offset= and ?limit= (50 by default, 1000 at most). Its
// cost is one lookup a zone for the summary, and the kinds of one page's zones only.
func (g *Global) serveZones(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	state, part := q.Get("state"), q.Get("zone")
	if state != "" && !containsString(zoneStates, state) {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Invalid request",
			Details: fmt.Sprintf("state %q: want one of %s", state, strings.Join(zoneStates, ", "))})
		return
	}
	offset, err := intParam(q.Get("offset"), 0, 0, 1<<31)
	if err != nil {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Invalid request", Details: "offset: " + err.Error()})
		return
	}
	limit, err := intParam(q.Get("limit"), DefaultZonesLimit, 1, MaxZonesLimit)
	if err != nil {
		api.WriteError(w, &api.Error{Status: http.StatusBadRequest, Title: "Invalid request", Details: "limit: " + err.Error()})
		return
	}
	api.WriteJSON(w, http.StatusOK, g.zonesAnswer(state, part, offset, limit))
}

func intParam(s string, def, lo, hi int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%q: want a whole number from %d to %d", s, lo, hi)
	}
	return n, nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// zonesAnswer makes GET /api/zones's answer.
func (g *Global) zonesAnswer(state, part string, offset, limit int) ZonesAnswer {
	var light []ZoneView
	for _, zi := range g.Zones.List() {
		light = append(light, ZoneView{ZoneInsight: zi})
	}
	light = g.replicas.merge(light, time.Now())
	ans := ZonesAnswer{Items: []ZoneView{}, Offset: offset, Limit: limit}
	var matching []zoneRow
	for _, v := range light {
		row := zoneRow{view: v}
		if v.Connected && v.Heartbeat == nil && g.Retry != nil { // this replica's own stream
			if s := g.Cache.Session(v.Stream); s != nil {
				row.retry = s.Retry().State()
			}
		}
		if row.retry != nil {
			row.failing, row.givenUp = len(row.retry.Failing) > 0, row.retry.GivenUp != ""
		}
		row.withholding = g.Holds != nil && g.Holds.Withholds(v.Zone)
		ans.Summary.Zones++
		for _, c := range []struct {
			on bool
			n  *int
		}{{v.Connected, &ans.Summary.Connected}, {!v.Connected, &ans.Summary.Disconnected}, {row.failing, &ans.Summary.Failing},
			{row.withholding, &ans.Summary.Withholding}, {row.givenUp, &ans.Summary.GivenUp}} {
			if c.on {
				*c.n++
			}
		}
		if (state == "" || row.is(state)) && strings.Contains(v.Zone, part) {
			matching = append(matching, row)
		}
	}
	ans.Total = len(matching)
	if offset >= len(matching) {
		return ans
	}
	page := matching[offset:min(offset+limit, len(matching))]
	var withheld func(zone string) []owner.Withheld
	if g.Holds != nil {
		withheld = g.Holds.Withheld
	}
	for _, row := range page {
		zi := row.view.ZoneInsight
		if full, ok := g.Zones.Insight(zi.Zone); ok && row.view.Heartbeat == nil {
			zi = full
		}
		views := zoneViews([]kds.ZoneInsight{zi}, func(int64) *retry.StreamState { return row.retry }, withheld)
		v := views[0]
		v.Replica, v.ReplicaAddress, v.Heartbeat = row.view.Replica, row.view.ReplicaAddress, row.view.Heartbeat
		if n := len(v.Withheld); n > maxWithheldShown {
			v.WithheldTotal = n
			v.Withheld = v.Withheld[:maxWithheldShown]
			v.Held = v.Withheld
		}
		ans.Items = append(ans.Items, v)
	}
	return ans
}

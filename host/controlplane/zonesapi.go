package controlplane

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
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

// zoneRow is one zone as the summary and the filter see it: cheap to make for every zone (no
// kinds, no copy of the retry state).
type zoneRow struct {
	engine.NodeInsight
	other                         *store.ZoneStream // the stream another replica serves, when it is there
	failing, withholding, givenUp bool
}

func (r *zoneRow) is(state string) bool {
	switch state {
	case "connected":
		return r.Connected
	case "disconnected":
		return !r.Connected
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
	if state != "" && !slices.Contains(zoneStates, state) {
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
	api.WriteJSON(w, http.StatusOK, g.zonesAnswer(state, part, offset, limit, maxWithheldShown))
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

// zonesAnswer makes GET /api/zones's answer.
// An item lists at most maxWithheld withheld resources (withheldTotal counts them all).
func (g *Global) zonesAnswer(state, part string, offset, limit, maxWithheld int) ZonesAnswer {
	now := time.Now()
	rows := g.zoneRows(now)
	ans := ZonesAnswer{Items: []ZoneView{}, Offset: offset, Limit: limit}
	var matching []int
	for i := range rows {
		row := &rows[i]
		if row.Connected && row.other == nil && g.Retry != nil { // this replica's own stream
			if s := g.Cache.Session(row.Stream); s != nil {
				row.failing, row.givenUp = s.Retry().Failing()
			}
		}
		row.withholding = g.Holds != nil && g.Holds.Withholds(row.Node)
		ans.Summary.Zones++
		if row.Connected {
			ans.Summary.Connected++
		} else {
			ans.Summary.Disconnected++
		}
		if row.failing {
			ans.Summary.Failing++
		}
		if row.withholding {
			ans.Summary.Withholding++
		}
		if row.givenUp {
			ans.Summary.GivenUp++
		}
		if (state == "" || row.is(state)) && strings.Contains(row.Node, part) {
			matching = append(matching, i)
		}
	}
	ans.Total = len(matching)
	if offset >= len(matching) {
		return ans
	}
	var withheld func(zone string) []Withheld
	if g.Holds != nil {
		withheld = func(zone string) []Withheld { return withheldOf(g.Holds.Withheld(zone)) }
	}
	for _, i := range matching[offset:min(offset+limit, len(matching))] {
		row := rows[i]
		zi := row.NodeInsight
		var rs *ZoneRetry
		if full, ok := g.Zones.Insight(zi.Node); ok {
			zi = full
		}
		if row.other == nil {
			if zi.Connected && g.Retry != nil {
				if s := g.Cache.Session(zi.Stream); s != nil {
					rs = zoneRetryOf(s.Retry().State())
				}
			}
		}
		v := zoneViews([]engine.NodeInsight{zi}, func(int64) *ZoneRetry { return rs }, withheld)[0]
		if row.other != nil {
			v.Replica, v.ReplicaAddress, v.Heartbeat = row.other.Replica, row.other.Address, &row.other.Heartbeat
		} else if v.Connected {
			v.Replica, v.ReplicaAddress = g.replicas.id, g.replicas.address
		}
		if n := len(v.Withheld); n > maxWithheld {
			v.WithheldTotal = n
			v.Withheld = v.Withheld[:maxWithheld]
			v.Held = v.Withheld
		}
		ans.Items = append(ans.Items, v)
	}
	return ans
}

// zoneRows is every zone, sorted: this replica's zone table, with the zones another replica
// serves (its heartbeat in the store) marked, or added when this replica does not know them.
func (g *Global) zoneRows(now time.Time) []zoneRow {
	list := g.Zones.List()
	rows := make([]zoneRow, len(list))
	for i, zi := range list {
		rows[i].NodeInsight = zi
	}
	elsewhere := g.replicas.elsewhere(now)
	if len(elsewhere) == 0 {
		return rows
	}
	for i := range rows {
		if z, ok := elsewhere[rows[i].Node]; ok {
			delete(elsewhere, rows[i].Node)
			if !rows[i].Connected {
				rows[i].other = &z // shown on that replica; the zone table's state kept
			}
		}
	}
	for _, z := range elsewhere {
		rows = append(rows, zoneRow{NodeInsight: engine.NodeInsight{Node: z.Zone, Connected: true, Since: z.Since}, other: &z})
	}
	slices.SortFunc(rows, func(a, b zoneRow) int { return strings.Compare(a.Node, b.Node) })
	return rows
}

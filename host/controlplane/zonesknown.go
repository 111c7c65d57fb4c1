package controlplane

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// watchKnownZones makes the zone signals durable when the store remembers zones
// (store.ZoneRegistry): kds_zone_connected shows every known zone, and a zone's stream count
// outlives its grace, until DELETE /api/zones/{zone} forgets it.
func (g *Global) watchKnownZones() {
	conns := zoneConnections{list: g.Zones.List}
	if reg, ok := g.cfg.Store.(store.ZoneRegistry); ok {
		g.probe.registry, g.probe.onKnown = reg, g.pruneZoneCounts
		g.zoneMetrics.durable = true
		conns.known = g.probe.knownZones
		conns.elsewhere = func() map[string]bool {
			out := map[string]bool{}
			for zone := range g.replicas.elsewhere(time.Now()) {
				out[zone] = true
			}
			return out
		}
		g.API.Handle("DELETE /api/zones/{zone}", http.HandlerFunc(g.forgetZone))
	}
	g.metrics.MustRegister(conns)
}

// pruneZoneCounts drops the durable stream counts of the zones neither known nor in the table.
func (g *Global) pruneZoneCounts(known map[string]bool) {
	inTable := map[string]bool{}
	for _, zi := range g.Zones.List() {
		inTable[zi.Node] = true
	}
	g.zoneMetrics.prune(func(zone string) bool { return known[zone] || inTable[zone] })
}

// forgetZone serves DELETE /api/zones/{zone}: the store forgets a zone that is gone for good, so
// that it is no longer shown as disconnected (kds_zone_connected) nor counted
// (kds_zone_streams_total). A zone connected to any replica is refused (409): it would be known
// again at once.
func (g *Global) forgetZone(w http.ResponseWriter, r *http.Request) {
	zone := r.PathValue("zone")
	if zi, ok := g.Zones.Insight(zone); ok && zi.Connected {
		api.WriteError(w, &api.Error{Status: http.StatusConflict, Title: "Zone connected",
			Details: fmt.Sprintf("zone %q is connected to this replica (since %s): stop it first", zone, zi.Since.Format(time.RFC3339))})
		return
	}
	if z, ok := g.replicas.elsewhere(time.Now())[zone]; ok {
		api.WriteError(w, &api.Error{Status: http.StatusConflict, Title: "Zone connected",
			Details: fmt.Sprintf("zone %q is connected to replica %s: stop it first", zone, z.Replica)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	forgot, err := g.probe.registry.ForgetZone(ctx, zone)
	if err != nil {
		api.WriteError(w, &api.Error{Status: http.StatusServiceUnavailable, Title: "Store unavailable", Details: fmt.Sprintf("forget zone %q: %v; retry later", zone, err)})
		return
	}
	if !forgot {
		api.WriteError(w, &api.Error{Status: http.StatusNotFound, Title: "Not found", Details: fmt.Sprintf("zone %q is not known: GET /api/zones lists the zones this replica serves or remembers", zone)})
		return
	}
	g.probe.forget(zone)
	g.pruneZoneCounts(g.probe.knownZones())
	g.log.Info("zone forgotten: no longer shown as disconnected", "zone", zone)
	api.WriteJSON(w, http.StatusOK, map[string]string{"result": fmt.Sprintf("zone %q forgotten", zone)})
}

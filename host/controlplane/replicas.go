package controlplane

import (
	"context"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/host/store"
)

// staleBeats is how many heartbeat intervals a zone stream's record stays fresh: past that its
// replica is taken for gone, the record is ignored, and the next heartbeat of any replica
// deletes it.
const staleBeats = 3

// replicaTimeout bounds each heartbeat's store calls.
const replicaTimeout = 5 * time.Second

// auditBeats is how often (in heartbeats) a heartbeat that changes nothing also expires stale
// records and counts this replica's: readers ignore stale records anyway, so deleting them
// every beat cost a scan of every zone's record every 2 s for nothing.
const auditBeats = 15

// replicas is a global's part among the replicas sharing its store: it records in the store
// which zones are connected here (one record per zone stream, refreshed by a heartbeat) and
// keeps what the other replicas recorded, so that ZoneViews shows where every zone is.
type replicas struct {
	id, address string
	interval    time.Duration
	rec         store.ZoneStreamRecorder // nil: the store records nothing, nor does this
	log         hclog.Logger

	mu     sync.Mutex         // guards others
	others []store.ZoneStream // the other replicas' fresh records, as of the last heartbeat

	// Owned by run's goroutine.
	recorded map[string]int64 // zone -> the stream recorded for it
	rewrite  bool             // the store lost some of this replica's records: put them all
	beats    int              // heartbeats made
	lastBeat time.Time        // the last heartbeat the store took
	gen      uint64           // the zones' StreamsGeneration when recorded was listed
	listed   bool             // gen is known
}

// newReplicas sets the replica's defaults from the bound KDS listener: its id is the host name
// and the KDS port, its address the KDS URL with that host name.
func newReplicas(cfg *GlobalConfig, kdsAddr string, log hclog.Logger) *replicas {
	host, port, _ := net.SplitHostPort(kdsAddr)
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host, _ = os.Hostname()
	}
	if cfg.ReplicaID == "" {
		name, _ := os.Hostname()
		cfg.ReplicaID = net.JoinHostPort(name, port)
	}
	if cfg.ReplicaAddress == "" {
		scheme := "grpc://"
		if cfg.TLS != nil {
			scheme = "grpcs://"
		}
		cfg.ReplicaAddress = scheme + net.JoinHostPort(host, port)
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 2 * time.Second
	}
	r := &replicas{id: cfg.ReplicaID, address: cfg.ReplicaAddress, interval: cfg.HeartbeatInterval, log: log, recorded: map[string]int64{}}
	r.rec, _ = cfg.Store.(store.ZoneStreamRecorder)
	return r
}

// run records the zones connected here every interval until ctx ends, then removes its records.
func (r *replicas) run(ctx context.Context, zones *engine.Nodes) {
	if r.rec == nil {
		return
	}
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		// The zones' streams are listed only when some opened or closed since the last beat
		// recorded them: at 10,000 zones the listing was most of an idle replica's CPU.
		if gen := zones.StreamsGeneration(); r.listed && gen == r.gen && !r.rewrite {
			r.beat(ctx, nil, true, time.Now())
		} else if r.beat(ctx, zones.Streams(), false, time.Now()) {
			r.gen, r.listed = gen, true
		}
		select {
		case <-ctx.Done():
			r.leave()
			return
		case <-tick.C:
		}
	}
}

// beat is one heartbeat: what changed since the last one is written, every record of this
// replica refreshed, and the others' fresh ones read. Stale records of any replica are deleted
// and this replica's counted (to find records another replica expired) when something changed,
// every auditBeats heartbeats, and after a heartbeat that failed or came late.
//
// same says that the zones connected are the ones the last beat recorded, on the same streams
// (insights is not read); beat reports whether it recorded the zones it was given.
func (r *replicas) beat(ctx context.Context, insights []engine.NodeInsight, same bool, now time.Time) bool {
	r.beats++
	hb := store.Heartbeat{Replica: r.id, Address: r.address, Now: now}
	if r.rewrite || r.beats%auditBeats == 1 || now.Sub(r.lastBeat) > (staleBeats-1)*r.interval {
		hb.ExpireBefore = now.Add(-staleBeats * r.interval)
	}
	connected := len(r.recorded)
	if !same {
		connected = 0
		for _, zi := range insights {
			if !zi.Connected {
				continue
			}
			connected++
			if id, ok := r.recorded[zi.Node]; r.rewrite || !ok || id != zi.Stream {
				hb.Put = append(hb.Put, store.ZoneStream{Zone: zi.Node, Since: zi.Since})
			}
		}
	}
	// With nothing put and as many zones connected as recorded, the zones are the recorded
	// ones, on the same streams: the table stays as it is.
	current := r.recorded
	if len(hb.Put) > 0 || connected != len(r.recorded) {
		current = make(map[string]int64, connected)
		for _, zi := range insights {
			if zi.Connected {
				current[zi.Node] = zi.Stream
			}
		}
		for zone := range r.recorded {
			if _, ok := current[zone]; !ok {
				hb.Gone = append(hb.Gone, zone)
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, replicaTimeout)
	defer cancel()
	// A replica without zones writes nothing (those that have zones expire stale records).
	if len(current) > 0 || len(hb.Gone) > 0 {
		n, err := r.rec.RecordZoneStreams(cctx, hb)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("record the zones connected to this replica", "error", err)
			}
			r.rewrite = true // whether it committed is not known
			return false
		}
		r.recorded, r.lastBeat = current, now
		if n >= 0 { // counted
			r.rewrite = n != int64(len(current))
		}
	} else {
		r.recorded = current
	}
	recorded := !r.rewrite
	others, err := r.rec.OtherZoneStreams(cctx, r.id, now.Add(-staleBeats*r.interval))
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("read the zones connected to other replicas", "error", err)
		}
		return recorded
	}
	r.mu.Lock()
	r.others = others
	r.mu.Unlock()
	return recorded
}

// leave removes this replica's records, so that the others do not show its zones until they
// are stale.
func (r *replicas) leave() {
	if len(r.recorded) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), replicaTimeout)
	defer cancel()
	hb := store.Heartbeat{Replica: r.id, Address: r.address, Now: time.Now()}
	for zone := range r.recorded {
		hb.Gone = append(hb.Gone, zone)
	}
	if _, err := r.rec.RecordZoneStreams(ctx, hb); err != nil {
		r.log.Warn("remove the zones of this replica from the store", "error", err)
	}
}

// elsewhere is, by zone, the newest fresh record of a stream another replica serves.
func (r *replicas) elsewhere(now time.Time) map[string]store.ZoneStream {
	r.mu.Lock()
	others := r.others
	r.mu.Unlock()
	newest := map[string]store.ZoneStream{}
	for _, z := range others {
		if z.Heartbeat.Before(now.Add(-staleBeats * r.interval)) {
			continue
		}
		if b, ok := newest[z.Zone]; !ok || z.Since.After(b.Since) {
			newest[z.Zone] = z
		}
	}
	return newest
}

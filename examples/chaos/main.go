// Command chaos is a soak of kds-host under random faults, in the spirit of etcd's functional
// tester and of Jepsen: two global replicas on a throwaway PostgreSQL, several zones each behind
// a fault proxy per replica, the reference plugins, steady writes (creates, updates, deletes,
// batches) through the replicas' API, and a seeded random schedule of faults for a given time:
// kill -9 and restart of a replica, a zone or a plugin; PostgreSQL stopped and started; a zone's
// connection stalled, reset, dropped or delayed; a replica stopped (SIGSTOP) and continued; slow
// zones (extra zones on every replica that subscribe with 64 KiB windows and stop reading, while
// large resources are stored); a bad row (a MeshTimeout whose labels or owners column is not
// JSON, written straight into PostgreSQL, then fixed by an API write). It records every write a
// replica acknowledged, and a probe measures how long a write takes to reach each zone that is
// not under a fault of its own, with slow zones present and without. After the last fault it
// heals everything and checks that every acknowledged write is in the global (none lost), that
// no name is listed twice (none duplicated), and that every zone holds exactly what the global
// holds (names, generations and content); it prints a table and exits 1 when any check fails.
//
//	go run ./examples/chaos -time 30s -seed 1 -bin ./bin
//	make chaos CHAOS_TIME=10m
//	make chaos CHAOS_ARGS="-slow-zones 0 -bad-rows=false"   # the faults before issue 47
//
// It needs the PostgreSQL server binaries (as the tests: host/store/pgtest) and the binaries of
// kds-host, retry-forcer and owner-check in -bin.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	var cfg config
	flag.DurationVar(&cfg.Duration, "time", 30*time.Second, "how long faults are injected (CHAOS_TIME in make chaos)")
	flag.Int64Var(&cfg.Seed, "seed", 1, "seed of the fault schedule and of the writes (the same seed, the same schedule)")
	flag.IntVar(&cfg.Zones, "zones", 3, "zones, each behind its own fault proxy to each replica")
	flag.StringVar(&cfg.Bin, "bin", "./bin", "folder of the kds-host, retry-forcer and owner-check binaries")
	flag.StringVar(&cfg.Out, "out", "", "also write the table to this file")
	flag.BoolVar(&cfg.Verbose, "v", false, "print each fault and each process's end as it happens")
	flag.IntVar(&cfg.SlowZones, "slow-zones", 5, `slow zones the "slow zones" fault starts on each replica: extra zones that subscribe to every kind with 64 KiB windows and stop reading (0: no such fault)`)
	flag.DurationVar(&cfg.SlowZoneHold, "slow-zone-hold", 40*time.Second, "how long slow zones stay before they leave (longer than the globals' --kds-response-timeout, 30s, so that they are seen dropped)")
	flag.IntVar(&cfg.BigBytes, "slow-zone-bytes", 16<<20, "bytes of large MeshTrafficPermissions written at the start, for the slow zones to hold in flight (a replica's in-flight budget is 64 MiB by default)")
	flag.BoolVar(&cfg.BadRows, "bad-rows", true, `the "bad row" fault: a MeshTimeout row with labels or owners that are not JSON, written straight into PostgreSQL, held, then fixed`)
	flag.Parse()
	rep, err := run(cfg)
	if rep != nil {
		table := rep.table()
		fmt.Print(table)
		if cfg.Out != "" {
			if werr := os.WriteFile(cfg.Out, []byte(table), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "chaos:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
	if problems := rep.problems(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "chaos: FAILED:", p)
		}
		os.Exit(1)
	}
}

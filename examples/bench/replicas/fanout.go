package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/host/store"
)

// fanOutCase is one fan-out configuration: the replicas up and the zones on each, and whether
// they listen each for itself (the changes relay off).
type fanOutCase struct {
	up      []string
	on      map[string]int
	noRelay bool
}

// fanOutFigures is one configuration's run: latencies, and CPU per write of each replica, of the
// zones' process and of PostgreSQL (the postmaster and its backends), each net of what the
// process used over as long a window with no write.
type fanOutFigures struct {
	lat      []time.Duration
	replica  map[string]time.Duration
	zones    time.Duration
	postgres time.Duration // net of the same window idle
	// postgresRaw is PostgreSQL's CPU over the writes' window, per write, idle work included.
	postgresRaw time.Duration
	// listen is the part of postgres that the replicas' LISTEN backends used (each delivers
	// every write's notification to its replica), net of idle.
	listen time.Duration
	// clients is the part that the other client backends used (the replicas' pools, the
	// writes' own connections), net of idle; the rest of postgres is its background processes
	// (WAL writer, checkpointer, autovacuum...) and backends that exited meanwhile.
	clients time.Duration
	// statements and rows are what PostgreSQL executed a write (pg_stat_statements: calls and
	// rows of every statement but the bench's own), net of idle; 0 when not counted.
	statements, rows float64
}

// fanOut times a write through A to every stream of zones zones on A alone, then with the
// streams on other replicas too, runs times (interleaved), and prints each configuration's
// medians and the ratios. CPU is what each process used over the timed writes, less what
// it used over as long a window right after with no write, per write (from /proc, 10 ms ticks): with every process on one machine, the machine's cores bound
// the wall-clock fan-out of three replicas, so CPU is the figure that says whether replicas
// scale out.
func (b *bench) fanOut(pg int, zones, writes, runs int) error {
	cases := []fanOutCase{
		{[]string{"A"}, map[string]int{"A": zones}, false},
		{[]string{"A", "B", "C"}, map[string]int{"A": zones}, false},
		{[]string{"A", "B", "C"}, map[string]int{"B": zones}, false},
		{[]string{"A", "B", "C"}, map[string]int{"A": zones, "B": zones, "C": zones}, false},
		// The same without the changes relay: every replica LISTENs.
		{[]string{"A", "B", "C"}, map[string]int{"A": zones, "B": zones, "C": zones}, true},
	}
	figs := make([][]fanOutFigures, len(cases))
	for run := range runs {
		for i, c := range cases {
			f, err := b.fanOutOnce(pg, c, writes)
			if err != nil {
				return fmt.Errorf("run %d, replicas %s, zones on %s: %w", run+1, strings.Join(c.up, ","), strings.Join(slices.Sorted(maps.Keys(c.on)), ","), err)
			}
			figs[i] = append(figs[i], f)
		}
	}
	fmt.Printf("3. fan-out: a write through A reaching every zone stream (%d writes each, medians of %d runs)\n", writes, runs)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "replicas up\trelay\tzones on\tstreams\tp50\tp90\tmax\tCPU per write, net of idle: A\tB\tC\tzones\tPostgreSQL\tof it LISTEN backends\tother client backends\tthe rest\tPostgreSQL with idle\tstatements a write\trows\t\n")
	med := func(i int, of func(fanOutFigures) time.Duration) time.Duration { return medianOf(figs[i], of) }
	for i, c := range cases {
		streams := 0
		for _, n := range c.on {
			streams += n
		}
		relay := "on"
		if c.noRelay {
			relay = "off"
		}
		cells := []string{strings.Join(c.up, ","), relay, strings.Join(slices.Sorted(maps.Keys(c.on)), ","), strconv.Itoa(streams),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return pct(f.lat, 50) })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return pct(f.lat, 90) })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return slices.Max(f.lat) }))}
		for _, id := range []string{"A", "B", "C"} {
			if slices.Contains(c.up, id) {
				cells = append(cells, benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.replica[id] })))
			} else {
				cells = append(cells, "-")
			}
		}
		cells = append(cells, benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.zones })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.postgres })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.listen })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.clients })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.postgres - f.listen - f.clients })),
			benchcp.Ms(med(i, func(f fanOutFigures) time.Duration { return f.postgresRaw })))
		if b.noStatements != "" {
			cells = append(cells, "-", "-")
		} else {
			cells = append(cells, fmt.Sprintf("%.1f", medianOf(figs[i], func(f fanOutFigures) float64 { return f.statements })),
				fmt.Sprintf("%.1f", medianOf(figs[i], func(f fanOutFigures) float64 { return f.rows })))
		}
		fmt.Fprintln(w, strings.Join(cells, "\t")+"\t")
	}
	w.Flush()
	one, three, threeAlone := 0, len(cases)-2, len(cases)-1
	base := med(one, func(f fanOutFigures) time.Duration { return f.replica["A"] })
	worst, worstID := time.Duration(0), ""
	for _, id := range []string{"A", "B", "C"} {
		if d := med(three, func(f fanOutFigures) time.Duration { return f.replica[id] }); d >= worst {
			worst, worstID = d, id
		}
	}
	ratio := func(a, b time.Duration) float64 {
		if b <= 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	p1 := med(three, func(f fanOutFigures) time.Duration { return pct(f.lat, 50) })
	p0 := med(one, func(f fanOutFigures) time.Duration { return pct(f.lat, 50) })
	pgAll := func(i int) time.Duration { return med(i, func(f fanOutFigures) time.Duration { return f.postgres }) }
	pgListen := func(i int) time.Duration { return med(i, func(f fanOutFigures) time.Duration { return f.listen }) }
	fmt.Printf("3 x %d vs 1 x %d: the busiest replica's CPU per write (%s) %.2fx the single replica's (limit 1.15); PostgreSQL's CPU per write %.2fx (limit: the same; %.2fx with its idle work over the longer window; %.2fx but for its LISTEN backends);\n",
		zones, zones, worstID, ratio(worst, base),
		ratio(pgAll(three), pgAll(one)),
		ratio(med(three, func(f fanOutFigures) time.Duration { return f.postgresRaw }), med(one, func(f fanOutFigures) time.Duration { return f.postgresRaw })),
		ratio(pgAll(three)-pgListen(three), pgAll(one)-pgListen(one)))
	pgClients := func(i int) time.Duration { return med(i, func(f fanOutFigures) time.Duration { return f.clients }) }
	pgRest := func(i int) time.Duration {
		return med(i, func(f fanOutFigures) time.Duration { return f.postgres - f.listen - f.clients })
	}
	// The LISTEN backends' share is a few 10 ms clock ticks over the writes: in ms, not a ratio.
	fmt.Printf("  of PostgreSQL's: LISTEN backends %s against %s a write, other client backends %.2fx, the rest (background processes, backends gone) %s against %s\n",
		benchcp.Ms(pgListen(three)), benchcp.Ms(pgListen(one)), ratio(pgClients(three), pgClients(one)), benchcp.Ms(pgRest(three)), benchcp.Ms(pgRest(one)))
	fmt.Printf("  without the changes relay (every replica LISTENs): PostgreSQL's CPU per write %.2fx (LISTEN backends %s a write); the busiest replica %.2fx\n",
		ratio(pgAll(threeAlone), pgAll(one)), benchcp.Ms(pgListen(threeAlone)),
		ratio(max(med(threeAlone, func(f fanOutFigures) time.Duration { return f.replica["A"] }),
			med(threeAlone, func(f fanOutFigures) time.Duration { return f.replica["B"] }),
			med(threeAlone, func(f fanOutFigures) time.Duration { return f.replica["C"] })), base))
	fmt.Printf("  A with three replicas up and only its own zones' streams (the others idle): %.2fx the single replica's\n",
		ratio(med(1, func(f fanOutFigures) time.Duration { return f.replica["A"] }), base))
	fmt.Printf("  wall clock p50 %.2fx, with every process on the same %d cores\n", ratio(p1, p0), runtime.NumCPU())
	if b.noStatements != "" {
		fmt.Printf("  PostgreSQL's statements a write: not counted (pg_stat_statements: %s)\n", b.noStatements)
	} else {
		fmt.Printf("  PostgreSQL's statements a write (pg_stat_statements, net of idle): %.1f with one replica, %.1f with three (rows %.1f and %.1f)\n",
			medianOf(figs[one], func(f fanOutFigures) float64 { return f.statements }), medianOf(figs[three], func(f fanOutFigures) float64 { return f.statements }),
			medianOf(figs[one], func(f fanOutFigures) float64 { return f.rows }), medianOf(figs[three], func(f fanOutFigures) float64 { return f.rows }))
	}
	return nil
}

// medianOf is the median of of over figs (pct's, the lower of two middles).
func medianOf[T cmp.Ordered](figs []fanOutFigures, of func(fanOutFigures) T) T {
	vs := make([]T, 0, len(figs))
	for _, f := range figs {
		vs = append(vs, of(f))
	}
	return pct(vs, 50)
}

// statementCount is pg_stat_statements' calls and rows so far, of every statement but the bench's
// own (its pg_stat_* queries); zero when statements are not counted.
type statementCount struct{ calls, rows int64 }

func (b *bench) statements() (statementCount, error) {
	var c statementCount
	if b.noStatements != "" {
		return c, nil
	}
	err := b.withDB(func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint
			FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_backend_pid%'`).Scan(&c.calls, &c.rows)
	})
	if err != nil {
		return c, fmt.Errorf("count PostgreSQL's statements: %w", err)
	}
	return c, nil
}

// fanOutOnce brings up c's replicas, starts its zones, and times writes through A.
func (b *bench) fanOutOnce(pg int, c fanOutCase, writes int) (fanOutFigures, error) {
	var fig fanOutFigures
	if c.noRelay != b.noRelay {
		// Every replica again, in the other mode; A first, as run starts it.
		b.stopAll()
		b.noRelay = c.noRelay
		if err := b.start("A"); err != nil {
			return fig, err
		}
	}
	for _, id := range []string{"B", "C"} {
		_, up := b.replicas[id]
		switch want := slices.Contains(c.up, id); {
		case up && !want:
			b.replicas[id].close()
			delete(b.replicas, id)
		case !up && want:
			if err := b.start(id); err != nil {
				return fig, err
			}
		}
	}
	b.seq++
	prefix := fmt.Sprintf("fan%d", b.seq)
	f, err := b.startFleet(c.on, prefix)
	if err != nil {
		return fig, err
	}
	defer f.close()
	time.Sleep(500 * time.Millisecond) // the streams' first pushes are over
	pids := map[string]int{}
	cpu0 := map[string]time.Duration{}
	for id, p := range b.replicas {
		pids[id] = p.cmd.Process.Pid
		cpu0[id] = cpuTime([]int{pids[id]})
	}
	fleet := []int{f.Cmd.Process.Pid}
	listeners, err := b.listenBackends()
	if err != nil {
		return fig, err
	}
	clients0, err := b.clientBackends(nil)
	if err != nil {
		return fig, err
	}
	st0, err := b.statements()
	if err != nil {
		return fig, err
	}
	fcpu0, pcpu0, lcpu0 := cpuTime(fleet), treeCPU(pg), cpuTime(listeners)
	start := time.Now()
	if fig.lat, err = b.timeWrites(f, "A", prefix, writes); err != nil {
		return fig, err
	}
	window := time.Since(start)
	used := map[string]time.Duration{}
	for id, pid := range pids {
		used[id] = cpuTime([]int{pid}) - cpu0[id]
	}
	fused, pused, lused := cpuTime(fleet)-fcpu0, treeCPU(pg)-pcpu0, cpuTime(listeners)-lcpu0
	st1, err := b.statements()
	if err != nil {
		return fig, err
	}
	clients1, err := b.clientBackends(clients0)
	if err != nil {
		return fig, err
	}

	// The same configuration idle for as long: what the processes use with no write (the
	// replicas' heartbeats, PostgreSQL's own background work) grows with the window, and three
	// replicas' fan-out on two cores takes a longer window than one's. Net of it, a figure is
	// what the writes cost.
	idle0 := map[string]time.Duration{}
	for id, pid := range pids {
		idle0[id] = cpuTime([]int{pid})
	}
	fidle0, pidle0, lidle0 := cpuTime(fleet), treeCPU(pg), cpuTime(listeners)
	st1idle, err := b.statements()
	if err != nil {
		return fig, err
	}
	time.Sleep(window)
	st2, err := b.statements()
	if err != nil {
		return fig, err
	}
	clients2, err := b.clientBackends(clients1)
	if err != nil {
		return fig, err
	}
	fig.statements = float64((st1.calls-st0.calls)-(st2.calls-st1idle.calls)) / float64(writes)
	fig.rows = float64((st1.rows-st0.rows)-(st2.rows-st1idle.rows)) / float64(writes)
	per := func(d time.Duration) time.Duration { return max(0, d) / time.Duration(writes) }
	fig.replica = map[string]time.Duration{}
	for id, pid := range pids {
		fig.replica[id] = per(used[id] - (cpuTime([]int{pid}) - idle0[id]))
	}
	fig.zones = per(fused - (cpuTime(fleet) - fidle0))
	pidle := treeCPU(pg) - pidle0
	fig.postgres, fig.postgresRaw = per(pused-pidle), per(pused)
	fig.listen = per(lused - (cpuTime(listeners) - lidle0))
	fig.clients = per(clients1.used(clients0) - clients2.used(clients1))
	return fig, nil
}

// backendCPU is the CPU each client backend used so far, by pid.
type backendCPU map[int]time.Duration

// used is the CPU the backends used since before: a backend that was not there started at 0
// (one that exited meanwhile is not counted: its CPU is in the postmaster's children's).
func (now backendCPU) used(before backendCPU) time.Duration {
	var d time.Duration
	for pid, t := range now {
		d += t - before[pid]
	}
	return d
}

// clientBackends is the CPU of PostgreSQL's client backends other than the LISTEN ones and the
// bench's own (the replicas' pools, the writes' connections): those listed now, and those of
// known that are still there.
func (b *bench) clientBackends(known backendCPU) (backendCPU, error) {
	pids, err := b.backends("client backends", `SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND application_name <> $1 AND pid <> pg_backend_pid()`, store.ListenApplicationName)
	if err != nil {
		return nil, err
	}
	for pid := range known {
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	out := backendCPU{}
	for _, pid := range pids {
		if statFields(pid) != nil {
			out[pid] = cpuTime([]int{pid})
		}
	}
	return out, nil
}

// listenBackends are the PostgreSQL backends of the replicas' LISTEN connections
// (store.ListenApplicationName in pg_stat_activity).
func (b *bench) listenBackends() ([]int, error) {
	return b.backends("LISTEN backends", "SELECT pid FROM pg_stat_activity WHERE application_name = $1", store.ListenApplicationName)
}

// backends are the pids a query of pg_stat_activity lists (what names them, for its error).
func (b *bench) backends(what, query string, args ...any) ([]int, error) {
	var pids []int
	err := b.withDB(func(ctx context.Context, db *sql.DB) error {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("list the %s: %w", what, err)
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				return err
			}
			pids = append(pids, pid)
		}
		return rows.Err()
	})
	return pids, err
}

// withDB runs f with a connection pool to the bench's database, closed after it, and ten
// seconds for the queries f makes.
func (b *bench) withDB(f func(context.Context, *sql.DB) error) error {
	db, err := sql.Open("pgx", b.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f(ctx, db)
}

// cpuTime is the user and system time the processes used so far (/proc/PID/stat).
func cpuTime(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		f := statFields(pid)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// treeCPU is the CPU a PostgreSQL server used so far: the postmaster's own, its children's
// that have exited (cutime, cstime) and its live children's (the backends, the writer, the
// checkpointer...).
func treeCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	var ticks int64
	if f := statFields(pid); len(f) >= 15 {
		for _, i := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
	}
	d := time.Duration(ticks) * 10 * time.Millisecond
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(child); len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, child)
		}
	}
	return d + cpuTime(kids)
}

// statFields are /proc/PID/stat's fields after the command name (which is in parentheses and
// may hold spaces): [0] is the state, [1] the parent's pid, [11] utime, [12] stime, [13]
// cutime, [14] cstime. Nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return strings.Fields(rest)
}

// timeWrites puts writes new MeshTimeouts through replica via and returns, for each, the time

package xdstest

import (
	"context"
	"fmt"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
)

// Options of a scenario. Zero values mean the defaults.
type Options struct {
	// Window is how long counts are collected after a change (default 1 s).
	Window time.Duration
	// Ready bounds the wait for the client's first RPC served (default 10 s).
	Ready time.Duration
	// Switches and Step: scenario 2 makes Switches route switches (default 20), Step apart
	// (default 50 ms).
	Switches int
	Step     time.Duration
	// AtEnd, if set, runs once the observation is over, while the client is still connected
	// (to read the server's view of it).
	AtEnd func()
}

func (o Options) withDefaults() Options {
	if o.Window <= 0 {
		o.Window = time.Second
	}
	if o.Ready <= 0 {
		o.Ready = 10 * time.Second
	}
	if o.Switches <= 0 {
		o.Switches = 20
	}
	if o.Step <= 0 {
		o.Step = 50 * time.Millisecond
	}
	return o
}

// Result is what a scenario counted. Only the fields its scenario names are set.
type Result struct {
	Scenario string
	// Ready: the client's RPCs reached the first backend before the change under test.
	Ready bool
	// Observed is how long RPCs were counted (the windows and, in scenario 2, the switches).
	Observed time.Duration
	// RPCs are the counts of the RPC loop over Observed.
	RPCs Counts
	// NACKs and Responses per type URL, over Observed, as the server counted them.
	NACKs     map[string]int
	Responses map[string]int
	// NACKsPerSecond is all NACKs over Observed, per second.
	NACKsPerSecond float64
	// ServerCPU is the CPU this process used over Observed (the server under test, the backends
	// and the harness: the backends and the harness cost the same whatever the server); ClientCPU
	// the client process's.
	ServerCPU, ClientCPU time.Duration
	// Delivered: after an endpoint move (scenarios 1, 4) or the last route switch (scenario 2),
	// RPCs reached the backend the move or switch points to; DeliveredRPCs is how many did.
	Delivered     bool
	DeliveredRPCs int
	// CSDS is the client's view at the end.
	CSDS []ResourceStatus
	// NACKMessages are the last NACK messages, when the server is a *Stock or has them.
	NACKMessages []string
	// Notes say what went wrong in the scenario itself (e.g. the client never got ready).
	Notes []string
}

// nackMessager is a Server that keeps NACK messages (a *Stock, anything embedding a Counter).
type nackMessager interface{ NACKMessages() []string }

// run is one scenario's bookkeeping: a client of srv, its counts, and the server's counts.
type run struct {
	ctx      context.Context
	srv      Server
	opt      Options
	c        *Client
	res      *Result
	n0, r0   map[string]int
	start    time.Time
	cpu0     time.Duration // this process's CPU at begin
	ccpu0    time.Duration // the client's
	ver      int
	prefix   string
	backends []*Backend // stopped by close
}

func newRun(ctx context.Context, srv Server, opt Options, name, prefix string) *run {
	return &run{ctx: ctx, srv: srv, opt: opt.withDefaults(), res: &Result{Scenario: name}, prefix: prefix}
}

func (r *run) set(rs Resources) error {
	r.ver++
	return r.srv.Set(fmt.Sprintf("%s-%d", r.prefix, r.ver), rs)
}

func (r *run) note(format string, args ...any) {
	r.res.Notes = append(r.res.Notes, fmt.Sprintf(format, args...))
}

// startClient starts the client and waits until backend serves an RPC.
func (r *run) startClient(backend string) error {
	c, err := StartClient(r.srv.Addr())
	if err != nil {
		return err
	}
	r.c = c
	ctx, cancel := context.WithTimeout(r.ctx, r.opt.Ready)
	defer cancel()
	if err := c.WaitBackend(ctx, backend); err != nil {
		r.note("not ready: %v", err)
		return nil
	}
	r.res.Ready = true
	return nil
}

// begin starts counting RPCs, and the server's counts unless serve started them.
func (r *run) begin() error {
	if _, err := r.c.Take(); err != nil {
		return err
	}
	if r.n0 == nil {
		r.n0, r.r0 = r.serverCounts()
	}
	r.start = time.Now()
	r.cpu0, r.ccpu0 = processCPU(), r.c.CPU()
	return nil
}

func (r *run) serverCounts() (nacks, resps map[string]int) {
	nacks, resps = map[string]int{}, map[string]int{}
	for _, t := range AllTypes {
		nacks[t] = r.srv.NACKs(t)
		resps[t] = r.srv.Responses(t)
	}
	return nacks, resps
}

// window waits the observation window (or ctx) and adds the RPC counts of it.
func (r *run) window() (Counts, error) {
	select {
	case <-r.ctx.Done():
		return Counts{}, r.ctx.Err()
	case <-time.After(r.opt.Window):
	}
	c, err := r.c.Take()
	r.res.RPCs.Add(c)
	return c, err
}

// deliveredTo counts one more window, says whether RPCs reached backend in it, and ends the run.
func (r *run) deliveredTo(backend string) (*Result, error) {
	c, err := r.window()
	if err != nil {
		return nil, err
	}
	r.res.DeliveredRPCs = c.ByBackend[backend]
	r.res.Delivered = r.res.DeliveredRPCs > 0
	r.end()
	return r.res, nil
}

// end stops counting and fills the result.
func (r *run) end() {
	n1, r1 := r.serverCounts()
	r.res.Observed = time.Since(r.start)
	r.res.NACKs, r.res.Responses = map[string]int{}, map[string]int{}
	total := 0
	for _, t := range AllTypes {
		r.res.NACKs[t] = n1[t] - r.n0[t]
		r.res.Responses[t] = r1[t] - r.r0[t]
		total += r.res.NACKs[t]
	}
	r.res.NACKsPerSecond = float64(total) / r.res.Observed.Seconds()
	r.res.ServerCPU, r.res.ClientCPU = processCPU()-r.cpu0, r.c.CPU()-r.ccpu0
	if c, err := r.c.StopLoop(); err == nil {
		r.res.RPCs.Add(c)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	if cs, err := r.c.CSDS(ctx); err != nil {
		r.note("csds: %v", err)
	} else {
		r.res.CSDS = cs
	}
	if m, ok := r.srv.(nackMessager); ok {
		r.res.NACKMessages = m.NACKMessages()
	}
	if r.opt.AtEnd != nil {
		r.opt.AtEnd()
	}
}

func (r *run) close() {
	if r.c != nil {
		r.c.Close()
	}
	StopBackends(r.backends)
}

// startBackends starts n backends named after the scenario's prefix; close stops them.
func (r *run) startBackends(n int) ([]*Backend, error) {
	bs, err := StartBackends(r.prefix+"-b", n)
	r.backends = bs
	return bs, err
}

// serve serves initial, starts the client, waits until backend serves its RPCs, and begins
// counting.
func (r *run) serve(initial Resources, backend *Backend) error {
	// The server's counts start before the client does: what it refuses of the first state it is
	// sent (and how often it is sent again) counts, however long the client takes to be up.
	r.n0, r.r0 = r.serverCounts()
	if err := r.set(initial); err != nil {
		return err
	}
	if err := r.startClient(backend.Name); err != nil {
		return err
	}
	return r.begin()
}

// NeverHeader is the header of the routes the RPC loop never takes (its RPCs never carry it).
const NeverHeader = "x-xdstest-never"

// Scenario1RefusedCluster: the route config has a second route (header NeverHeader, which no RPC
// carries) to a cluster with lb_policy MAGLEV, which grpc-go refuses; the first route goes to a
// good cluster on backend 0. For one window it counts NACKs (per second) and RPC failures while the
// refused cluster stands; then it moves the good cluster's endpoint to backend 1 and, for a second
// window, counts whether RPCs reach backend 1 (Delivered). Observed covers both windows.
func Scenario1RefusedCluster(ctx context.Context, srv Server, opt Options) (*Result, error) {
	r := newRun(ctx, srv, opt, "1 refused cluster", "s1")
	defer r.close()
	bs, err := r.startBackends(2)
	if err != nil {
		return nil, err
	}
	state := func(b *Backend) Resources {
		return State(RouteConfig(RouteName, Route{Cluster: "bad", Header: NeverHeader}, Route{Cluster: "good"}),
			[]*cluster.Cluster{Cluster("good"), Cluster("bad", Maglev())},
			Endpoints("good", b.Addr))
	}
	if err := r.serve(state(bs[0]), bs[0]); err != nil {
		return nil, err
	}
	if _, err := r.window(); err != nil {
		return nil, err
	}
	if err := r.set(state(bs[1])); err != nil {
		return nil, err
	}
	return r.deliveredTo(bs[1].Name)
}

// Scenario2RouteSwitches: the route goes to cluster c0 (backend 0); then, Step apart, Switches
// times, the route moves to a new valid cluster ci with its endpoints (backend i mod 3), the
// snapshot holding only the current cluster. RPCs are counted from the first switch to one window
// after the last; failures are kept per message. Delivered: RPCs reached the last cluster's backend
// in that window.
func Scenario2RouteSwitches(ctx context.Context, srv Server, opt Options) (*Result, error) {
	r := newRun(ctx, srv, opt, "2 route switches", "s2")
	defer r.close()
	bs, err := r.startBackends(3)
	if err != nil {
		return nil, err
	}
	state := func(i int) Resources {
		name := fmt.Sprintf("c%d", i)
		return State(RouteTo(RouteName, name), []*cluster.Cluster{Cluster(name)}, Endpoints(name, bs[i%len(bs)].Addr))
	}
	if err := r.serve(state(0), bs[0]); err != nil {
		return nil, err
	}
	n := r.opt.Switches
	for i := 1; i <= n; i++ {
		if err := r.set(state(i)); err != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(r.opt.Step):
		}
	}
	c, err := r.c.Take()
	if err != nil {
		return nil, err
	}
	r.res.RPCs.Add(c)
	return r.deliveredTo(bs[n%len(bs)].Name)
}

// Scenario3RefusedRoute: the route goes to a good cluster (backend 0); then it is switched to a new
// cluster with lb_policy MAGLEV (and its endpoints, backend 0), which grpc-go refuses. For one
// window it counts RPC failures out of RPCs made while that stands, and NACKs.
func Scenario3RefusedRoute(ctx context.Context, srv Server, opt Options) (*Result, error) {
	r := newRun(ctx, srv, opt, "3 route to refused cluster", "s3")
	defer r.close()
	bs, err := r.startBackends(1)
	if err != nil {
		return nil, err
	}
	if err := r.serve(State(RouteTo(RouteName, "good"), []*cluster.Cluster{Cluster("good")}, Endpoints("good", bs[0].Addr)), bs[0]); err != nil {
		return nil, err
	}
	if err := r.set(State(RouteTo(RouteName, "bad"), []*cluster.Cluster{Cluster("bad", Maglev())}, Endpoints("bad", bs[0].Addr))); err != nil {
		return nil, err
	}
	if _, err := r.window(); err != nil {
		return nil, err
	}
	r.end()
	return r.res, nil
}

// Scenario4UnrequestedCluster: the route goes to cluster A (backend 0); then A's endpoint moves to
// backend 1 while the snapshot also gets a cluster B with its endpoints, which no route references
// and the client never asks for. For one window it counts whether RPCs reach backend 1
// (Delivered), and the responses sent.
func Scenario4UnrequestedCluster(ctx context.Context, srv Server, opt Options) (*Result, error) {
	r := newRun(ctx, srv, opt, "4 unrequested cluster", "s4")
	defer r.close()
	bs, err := r.startBackends(2)
	if err != nil {
		return nil, err
	}
	if err := r.serve(State(RouteTo(RouteName, "A"), []*cluster.Cluster{Cluster("A")}, Endpoints("A", bs[0].Addr)), bs[0]); err != nil {
		return nil, err
	}
	if err := r.set(State(RouteTo(RouteName, "A"), []*cluster.Cluster{Cluster("A"), Cluster("B")},
		Endpoints("A", bs[1].Addr), Endpoints("B", bs[0].Addr))); err != nil {
		return nil, err
	}
	return r.deliveredTo(bs[1].Name)
}

// Scenario is one of the four scenarios.
type Scenario struct {
	Name string
	Run  func(context.Context, Server, Options) (*Result, error)
}

// Scenarios are the four scenarios in order.
var Scenarios = []Scenario{
	{"1 refused cluster", Scenario1RefusedCluster},
	{"2 route switches", Scenario2RouteSwitches},
	{"3 route to refused cluster", Scenario3RefusedRoute},
	{"4 unrequested cluster", Scenario4UnrequestedCluster},
}

// Command xdsclient runs the four scenarios of internal/xdstest (grpc-go's own xDS client against a
// SotW ADS management server on loopback) against a server under test and prints a table of the
// counts.
//
//	go run ./examples/bench/xdsclient [-target stock|guard] [-window 1s] [-v]
//
// CPU columns are cores (CPU seconds per second observed): "server" is this process (the server
// under test, the backends and the harness), "client" the grpc-go client process.
//
// A target is one line of targets: a name and a function that starts a fresh xdstest.Server (each
// scenario gets its own server) and returns it with its close function.
package main

import (
	"context"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"

	"flag"
	"fmt"
	"github.com/kds-host/kds-host/guard"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kds-host/kds-host/internal/xdstest"
)

// targets are the servers the scenarios can run against.
var targets = map[string]func() (xdstest.Server, func(), error){
	"stock": func() (xdstest.Server, func(), error) {
		s, err := xdstest.NewStock()
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	},
	"guard": func() (xdstest.Server, func(), error) {
		var gerr error
		s, err := xdstest.NewWrapped(func(inner cache.Cache, cb server.Callbacks) (cache.Cache, server.Callbacks, func()) {
			g, err := guard.New(inner, guard.Options{})
			if err != nil {
				gerr = err
				return inner, cb, nil
			}
			return g, g.Callbacks(cb), g.Close
		})
		if err == nil {
			err = gerr
		}
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	},
}

func main() {
	target := flag.String("target", "stock", "server under test: "+strings.Join(names(), ", "))
	window := flag.Duration("window", time.Second, "observation window of each scenario")
	verbose := flag.Bool("v", false, "print failure messages, NACK messages and CSDS per scenario")
	flag.Parse()
	defer xdstest.RemoveBuiltClient()
	start, ok := targets[*target]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown target %q (have %v)\n", *target, names())
		os.Exit(2)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "target %s\tscenario\tready\tobserved\tRPCs\tok\tfailed\tNACKs\tNACK/s\tresp LDS/RDS/CDS/EDS\tdelivered\tfailure kinds\tserver CPU\tclient CPU\t\n", *target)
	var details []string
	failed := false
	for _, sc := range xdstest.Scenarios {
		srv, closeSrv, err := start()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := sc.Run(ctx, srv, xdstest.Options{Window: *window})
		cancel()
		closeSrv()
		if err != nil {
			fmt.Fprintf(tw, "\t%s\terror: %v\t\n", sc.Name, err)
			failed = true
			continue
		}
		nacks := 0
		for _, n := range res.NACKs {
			nacks += n
		}
		delivered := "-"
		if sc.Name != "3 route to refused cluster" {
			delivered = fmt.Sprintf("%v (%d RPCs)", res.Delivered, res.DeliveredRPCs)
		}
		fmt.Fprintf(tw, "\t%s\t%v\t%v\t%d\t%d\t%d\t%d\t%.0f\t%d/%d/%d/%d\t%s\t%s\t%.2f\t%.2f\t\n", res.Scenario, res.Ready,
			res.Observed.Round(time.Millisecond), res.RPCs.RPCs, res.RPCs.OK, res.RPCs.Failed, nacks, res.NACKsPerSecond,
			res.Responses[xdstest.ListenerType], res.Responses[xdstest.RouteType], res.Responses[xdstest.ClusterType],
			res.Responses[xdstest.EndpointType], delivered, kinds(res.RPCs.Kinds()),
			res.ServerCPU.Seconds()/res.Observed.Seconds(), res.ClientCPU.Seconds()/res.Observed.Seconds())
		if *verbose {
			var b strings.Builder
			fmt.Fprintf(&b, "== %s\n  RPCs: %s\n", res.Scenario, res.RPCs)
			if n := len(res.NACKMessages); n > 0 {
				fmt.Fprintf(&b, "  last NACK: %s\n", res.NACKMessages[n-1])
			}
			for _, r := range res.CSDS {
				fmt.Fprintf(&b, "  CSDS %s %s %s version %q", r.TypeURL[strings.LastIndex(r.TypeURL, ".")+1:], r.Name, r.Status, r.Version)
				if r.NACK != "" {
					fmt.Fprintf(&b, " NACK %.80q", r.NACK)
				}
				b.WriteString("\n")
			}
			for _, n := range res.Notes {
				fmt.Fprintf(&b, "  note: %s\n", n)
			}
			details = append(details, b.String())
		}
	}
	tw.Flush()
	for _, d := range details {
		fmt.Print("\n" + d)
	}
	if failed {
		os.Exit(1)
	}
}

func kinds(m map[string]int) string {
	var ks []string
	for k, v := range m {
		ks = append(ks, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(ks)
	if len(ks) == 0 {
		return "-"
	}
	return strings.Join(ks, " ")
}

func names() []string {
	var ns []string
	for n := range targets {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}

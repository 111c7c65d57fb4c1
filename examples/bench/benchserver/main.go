// Command benchserver is the kds-host side of examples/bench/scale: a global as `kds-host run`
// makes it, with its defaults (owner holds on, the built-in owner check and retry policy, zone
// tokens required, a zone grace of 1m, 16 streams per connection, SQLite under a temp dir),
// except that KDS is plaintext on loopback (as --kds-plaintext). Its store holds Mesh "default"
// and N MeshTimeouts (benchproc.Resources), written before the global starts.
//
//	benchserver -resources 1000 -zones 100 -tokens FILE [-owner-holds=false] [-kds-auth=false] [-tmp DIR] [-cpuprofile FILE [-cpuprofile-after-sync FILE]] [-heapprofile FILE]
//
// It mints a zone token for each of zone-0000 ... zone-(N-1) into FILE, one a line, then, once
// the global serves, prints a benchproc.Ready line. Its control endpoint writes the target
// MeshTimeout to the global's store (store.Put: what the API's apply does after parsing, and
// the global notices it the same way) and reports the live heap. It stops when its standard
// input closes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kds-host/kds-host/engine"
	"github.com/kds-host/kds-host/examples/bench/internal/benchcp"
	"github.com/kds-host/kds-host/examples/bench/internal/benchproc"
	"github.com/kds-host/kds-host/host/auth"
	"github.com/kds-host/kds-host/host/controlplane"
	"github.com/kds-host/kds-host/host/resource"
	"github.com/kds-host/kds-host/plugins/retry-forcer/retrypolicy"
)

func main() {
	n := flag.Int("resources", 1000, "MeshTimeouts in the store (and Mesh \"default\")")
	zones := flag.Int("zones", 0, "zone tokens to mint (zone-0000 ...)")
	tokens := flag.String("tokens", "", "write the zone tokens here, one a line")
	holds := flag.Bool("owner-holds", true, "the global's --owner-holds")
	kdsAuth := flag.Bool("kds-auth", true, "the global's --kds-auth: zone tokens required (false: no token is checked, as stock checks none)")
	tmp := flag.String("tmp", "", "where the store's temp dir goes (default: the system temp dir)")
	addr := flag.String("kds-addr", "127.0.0.1:0", "KDS listen address")
	logLevel := flag.String("log", "off", "the global's log level: off, error, warn, info, debug")
	prof := benchproc.ProfileFlags()
	flag.Parse()
	if err := run(*n, *zones, *tokens, *holds, *kdsAuth, *tmp, *addr, *logLevel, prof); err != nil {
		fmt.Fprintln(os.Stderr, "benchserver:", err)
		os.Exit(1)
	}
}

func run(n, zones int, tokensFile string, holds, kdsAuth bool, tmp, addr, logLevel string, prof *benchproc.Profiles) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := benchproc.UntilStdinCloses(ctx)
	defer cancel()

	dir, err := os.MkdirTemp(tmp, "kds-bench-server-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := benchcp.OpenSQLite(ctx, dir)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := benchcp.Fill(ctx, st, benchproc.Resources(n), 1000); err != nil {
		return fmt.Errorf("fill the store: %w", err)
	}

	keys, err := auth.NewKeys()
	if err != nil {
		return err
	}
	if zones > 0 {
		if tokensFile == "" {
			return fmt.Errorf("-zones needs -tokens FILE")
		}
		list := make([]string, zones)
		for i := range list {
			if list[i], err = keys.Issue(auth.Claims{Kind: auth.KindZone, Name: benchproc.ZoneName(i)}, 24*time.Hour, time.Now()); err != nil {
				return err
			}
		}
		if err := os.WriteFile(tokensFile, []byte(strings.Join(list, "\n")+"\n"), 0o600); err != nil {
			return err
		}
	}

	reg := resource.Default()
	// The values are `kds-host run`'s flag defaults (host/cmd/kds-host/run.go).
	gl, err := benchcp.StartGlobal(ctx, controlplane.GlobalConfig{
		Store: st, Registry: reg, Logger: benchcp.Logger(logLevel, "global"), KDSAddr: addr,
		Builtin: retrypolicy.New(), PolicyTimeout: 200 * time.Millisecond,
		OwnerHolds: holds, OwnerCheckTimeout: time.Second,
		Limits: engine.DefaultLimits(), ZoneGrace: time.Minute, MaxStreamsPerConnection: 16,
		Keys: keys, KDSAuth: kdsAuth,
	})
	if err != nil {
		return err
	}
	defer func() {
		if serr := gl.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop the global: %w", serr)
		}
	}()

	update := func(ctx context.Context, seq int) error {
		r := benchproc.Updated(seq)
		if err := reg.Validate(&r); err != nil {
			return err
		}
		_, changed, err := st.Put(ctx, r)
		if err == nil && !changed {
			err = fmt.Errorf("the store saw no change")
		}
		return err
	}
	control, err := benchproc.Control(ctx, prof, update)
	if err != nil {
		return err
	}
	if err := prof.StartCPU(); err != nil {
		return err
	}
	defer func() {
		if perr := prof.StopCPU(); perr != nil && err == nil {
			err = perr
		}
	}()
	fmt.Println(benchproc.Ready(gl.KDSAddr(), control))
	<-ctx.Done()
	return nil
}

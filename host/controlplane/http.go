package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/kds-host/kds-host/host/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
)

func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}

// diagHandler serves /healthz (the process is up), /readyz (it serves its data: ready says why
// not, or a note for the "ok" line, and never waits) and /metrics, and with pprof the Go
// profiles under /debug/pprof/.
func diagHandler(reg *prometheus.Registry, ready func() (string, error), profiles bool) http.Handler {
	mux := http.NewServeMux()
	if profiles {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		note, err := ready()
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if note != "" {
			note = ": " + note
		}
		w.Write([]byte("ok" + note + "\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// readyTimeout bounds the store probe's check (storeProbe).
const readyTimeout = 2 * time.Second

// storeReady pings the store (its revision) within ctx's deadline and, while its writes fail
// for lack of space, probes whether they can succeed again (store.SpaceWatcher).
func storeReady(ctx context.Context, st store.Store) error {
	if _, err := st.Revision(ctx); err != nil {
		return fmt.Errorf("the store does not answer: %w", err)
	}
	if sw, ok := st.(store.SpaceWatcher); ok && sw.OutOfSpace() {
		err := sw.ProbeSpace(ctx)
		switch {
		case errors.Is(err, store.ErrNoSpace):
			return errors.New("the store has no space left to write: writes fail until space is freed on the database's disk (or its quota raised); they resume by themselves")
		case err != nil:
			return fmt.Errorf("the store's writes failed for lack of space, and its probe fails: %w", err)
		}
	}
	return nil
}

func shutdown(servers ...*http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(ctx); err != nil {
			s.Close()
		}
	}
}

// stopGRPC stops gracefully, but not for longer than 5 s: zone streams never end by themselves.
func stopGRPC(s *grpc.Server) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.Stop()
		<-done
	}
}

package controlplane

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kds-host/kds-host/host/api"
	"github.com/kds-host/kds-host/host/store"
)

// observeStore times every operation of st in kds_store_operation_seconds, when st tells them
// (store.Observable).
func observeStore(reg prometheus.Registerer, st store.Store) {
	o, ok := st.(store.Observable)
	if !ok {
		return
	}
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kds_store_operation_seconds",
		Help:    "Time of each store operation (a read, a write, a heartbeat, the probe's), by operation and result (ok or error).",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}, []string{"operation", "result"})
	reg.MustRegister(h)
	for _, op := range store.Operations {
		h.WithLabelValues(op, "ok")
		h.WithLabelValues(op, "error")
	}
	o.ObserveOperations(func(op string, took time.Duration, err error) {
		result := "ok"
		if err != nil {
			result = "error"
		}
		h.WithLabelValues(op, result).Observe(took.Seconds())
	})
}

// apiMetrics times the requests of an HTTP API by route and status code.
type apiMetrics struct {
	seconds *prometheus.HistogramVec
}

func newAPIMetrics(reg prometheus.Registerer) *apiMetrics {
	m := &apiMetrics{seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kds_api_request_seconds",
		Help:    "Time to answer each HTTP API request, by route (the method and the pattern that served it: \"GET /meshes/{mesh}/{plural}\"; \"other\" for none) and status code.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"route", "code"})}
	reg.MustRegister(m.seconds)
	return m
}

// apiRoute names the route of a request to a, the status page's files as "/gui".
func apiRoute(a *api.Server) func(*http.Request) string {
	return func(r *http.Request) string {
		if isStatusPath(r) {
			return "/gui"
		}
		return a.Route(r)
	}
}

// knownMethods bound the route label: a request with another method is "OTHER".
var knownMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true}

// handler times next's answers; route names the pattern that serves a request ("" for none).
func (m *apiMetrics) handler(route func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		pattern := route(r)
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if pattern == "" {
			pattern = "other"
		}
		if pattern[0] == '/' { // a pattern without a method
			method := r.Method
			if !knownMethods[method] {
				method = "OTHER"
			}
			pattern = method + " " + pattern
		}
		code := sw.status
		if code == 0 {
			code = http.StatusOK
		}
		m.seconds.WithLabelValues(pattern, strconv.Itoa(code)).Observe(time.Since(began).Seconds())
	})
}

// statusWriter remembers the status code written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath (Flush, deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes a flush on, for handlers that check for http.Flusher.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// grpcMetrics counts the RPCs and streams of the KDS listener as they end, by method and status
// code.
type grpcMetrics struct {
	handled *prometheus.CounterVec
}

// adsMethod is the KDS stream's full method name.
const adsMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

func newGRPCMetrics(reg prometheus.Registerer) *grpcMetrics {
	m := &grpcMetrics{handled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kds_grpc_server_handled_total",
		Help: "RPCs and streams on the KDS listener (zone streams, health checks, the changes relay) that ended, by full method name and gRPC status code."},
		[]string{"grpc_method", "grpc_code"})}
	reg.MustRegister(m.handled)
	// The codes a zone stream ends with, at 0 from the start (rates miss a series' first event).
	for _, c := range []codes.Code{codes.OK, codes.Canceled, codes.Unknown, codes.InvalidArgument, codes.DeadlineExceeded,
		codes.PermissionDenied, codes.ResourceExhausted, codes.Unavailable, codes.Internal, codes.Unauthenticated} {
		m.handled.WithLabelValues(adsMethod, c.String())
	}
	return m
}

func (m *grpcMetrics) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			err := handler(srv, ss)
			m.handled.WithLabelValues(info.FullMethod, codeOf(ss.Context(), err).String()).Inc()
			return err
		}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			resp, err := handler(ctx, req)
			m.handled.WithLabelValues(info.FullMethod, codeOf(ctx, err).String()).Inc()
			return resp, err
		}),
	}
}

// codeOf is the status code a handler's error ends its call with, as gRPC sends it.
func codeOf(ctx context.Context, err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Code()
	}
	return codes.Unknown
}

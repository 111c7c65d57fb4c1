package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// source serves a resources file through a SnapshotCache. Each read whose content differs from
// the content served and parses is a new snapshot version; a read that is refused (see
// parseResources and read) leaves the last good snapshot served.
type source struct {
	file       string
	maxBytes   int64                                                                            // --max-resources-bytes
	allowEmpty bool                                                                             // --allow-empty
	set        func(ctx context.Context, version string, res map[string][]types.Resource) error // serves a version
	log        hclog.Logger

	// Owned by the goroutine that reads the file (runWith's until the watch starts, then the
	// watch's).
	version    int    // snapshot versions set
	servedSum  string // sha256 of the content served
	refusedKey string // the last refusal's content sha256 (or error text): refused, logged and counted once

	mu     sync.Mutex // guards status and refused; never held across a read or SetSnapshot
	status fileStatus
	// refused counts refusals by reason.
	refused map[string]int64
}

// fileStatus is what /healthz, /readyz and /metrics say about the resources file.
type fileStatus struct {
	version   string    // of the snapshot served
	sum       string    // sha256 of the content served
	loadedAt  time.Time // when it was read, parsed and given to the cache
	resources int       // how many it holds
	refusal   error     // why the last read was refused; nil when it was served or matched
	refusedAt time.Time
}

func newSource(file string, maxBytes int64, allowEmpty bool, set func(context.Context, string, map[string][]types.Resource) error, log hclog.Logger) *source {
	return &source{file: file, maxBytes: maxBytes, allowEmpty: allowEmpty, set: set, log: log, refused: map[string]int64{}}
}

// start reads and serves the file once, before anything listens: a refusal is an error.
func (s *source) start(ctx context.Context) error {
	data, sum, err := s.read()
	if err == nil {
		err = s.serve(ctx, data, sum)
	}
	return err
}

// reload reads the file and serves its content if it differs from the content served and
// parses; a refusal is logged at ERROR and counted once per content (or read error), and the
// last good resources stay served.
func (s *source) reload(ctx context.Context) {
	data, sum, err := s.read()
	key := sum
	if err != nil {
		key = err.Error()
	} else if sum == s.servedSum {
		s.refusedKey = ""
		s.mu.Lock()
		back, version := s.status.refusal != nil, s.status.version
		s.status.refusal = nil
		s.mu.Unlock()
		if back {
			s.log.Info("the resources file holds the served content again", "file", s.file, "version", version)
		}
		return // touched, swapped or rewritten with the same content
	}
	if key == s.refusedKey {
		return
	}
	if err == nil {
		err = s.serve(ctx, data, sum)
	}
	if err == nil {
		s.refusedKey = ""
		return
	}
	s.refusedKey = key
	var r *refusal
	if !errors.As(err, &r) {
		r = &refusal{reason: refusedResource, err: err}
	}
	s.mu.Lock()
	s.status.refusal, s.status.refusedAt = r, time.Now()
	s.refused[r.reason]++
	served := s.status.version
	s.mu.Unlock()
	s.log.Error("the resources file is refused; the last good resources stay served",
		"file", s.file, "reason", r.reason, "error", r.err, "served_version", served)
}

// read reads the file, at most maxBytes of it, and returns its content and sha256, or a refusal.
func (s *source) read() ([]byte, string, error) {
	f, err := os.Open(s.file)
	if err != nil {
		return nil, "", &refusal{reason: refusedRead, err: err}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, s.maxBytes+1))
	if err != nil {
		return nil, "", &refusal{reason: refusedRead, err: err}
	}
	if int64(len(data)) > s.maxBytes {
		return nil, "", refuse(refusedTooLarge, "the file is larger than --max-resources-bytes (%d bytes)", s.maxBytes)
	}
	h := sha256.Sum256(data)
	return data, hex.EncodeToString(h[:]), nil
}

// serve parses data and sets it as the next snapshot version.
func (s *source) serve(ctx context.Context, data []byte, sum string) error {
	res, n, err := parseResources(data, s.allowEmpty)
	if err != nil {
		return err
	}
	version := fmt.Sprintf("%d-%s", s.version+1, sum[:8])
	at := time.Now() // the moment the cache is given the change: its clients' update latency counts from here
	if err := s.set(ctx, version, res); err != nil {
		return &refusal{reason: refusedResource, err: err}
	}
	s.version++
	s.servedSum = sum
	s.mu.Lock()
	s.status = fileStatus{version: version, sum: sum, loadedAt: at, resources: n}
	s.mu.Unlock()
	counts := make([]string, 0, len(res))
	for t, rs := range res {
		counts = append(counts, fmt.Sprintf("%s=%d", shortType(t), len(rs)))
	}
	sort.Strings(counts)
	if n == 0 {
		s.log.Warn("serving no resources: the file holds none and --allow-empty is set; every client loses every resource", "file", s.file, "version", version)
	}
	s.log.Info("serving resources", "file", s.file, "version", version, "resources", n, "by_type", counts)
	return nil
}

func (s *source) snapshotStatus() fileStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// describe says what is served and, if the last read was refused, why.
func (st fileStatus) describe() string {
	served := fmt.Sprintf("serving version %s (%d resources, read %s)", st.version, st.resources, st.loadedAt.UTC().Format(time.RFC3339))
	if st.refusal == nil {
		return served
	}
	return fmt.Sprintf("the resources file was refused at %s: %v; %s", st.refusedAt.UTC().Format(time.RFC3339), st.refusal, served)
}

// healthz answers 200 once serving (ok, followed by what describe says if the last read was
// refused: the last good resources are served, and a restart would refuse the same file).
func (s *source) healthz(serving func() bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if !serving() {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		if st := s.snapshotStatus(); st.refusal != nil {
			io.WriteString(w, "ok: "+st.describe())
			return
		}
		io.WriteString(w, "ok")
	}
}

// readyz answers 200 ok once serving while the last read of the file was served (or matched
// what is served), 503 naming the refusal while it was refused.
func (s *source) readyz(serving func() bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if !serving() {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		if st := s.snapshotStatus(); st.refusal != nil {
			http.Error(w, st.describe(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}
}

var (
	fileRefusedDesc = prometheus.NewDesc("kds_xds_resources_file_refused_total",
		"Reads of the resources file refused (the last good resources stay served), by reason; each content or read error counts once.", []string{"reason"}, nil)
	fileRefusingDesc = prometheus.NewDesc("kds_xds_resources_file_refusing",
		"1 while the last read of the resources file was refused, else 0.", nil, nil)
	fileLoadedDesc = prometheus.NewDesc("kds_xds_resources_file_loaded_timestamp_seconds",
		"When the content served was read from the resources file and given to the cache (Unix time; what the cache does with it, its answers to the clients included, comes after).", nil, nil)
	fileInfoDesc = prometheus.NewDesc("kds_xds_resources_file_loaded_info",
		"Always 1: the snapshot version served and the sha256 of the file content it was read from.", []string{"version", "sha256"}, nil)
	fileResourcesDesc = prometheus.NewDesc("kds_xds_resources_file_loaded_resources",
		"Resources in the content served.", nil, nil)
)

func (s *source) Describe(ch chan<- *prometheus.Desc) {
	ch <- fileRefusedDesc
	ch <- fileRefusingDesc
	ch <- fileLoadedDesc
	ch <- fileInfoDesc
	ch <- fileResourcesDesc
}

func (s *source) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	st := s.status
	refused := make(map[string]int64, len(s.refused))
	for k, v := range s.refused {
		refused[k] = v
	}
	s.mu.Unlock()
	for _, reason := range refusedReasons {
		ch <- prometheus.MustNewConstMetric(fileRefusedDesc, prometheus.CounterValue, float64(refused[reason]), reason)
	}
	refusing := 0.0
	if st.refusal != nil {
		refusing = 1
	}
	ch <- prometheus.MustNewConstMetric(fileRefusingDesc, prometheus.GaugeValue, refusing)
	ch <- prometheus.MustNewConstMetric(fileLoadedDesc, prometheus.GaugeValue, float64(st.loadedAt.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(fileInfoDesc, prometheus.GaugeValue, 1, st.version, st.sum)
	ch <- prometheus.MustNewConstMetric(fileResourcesDesc, prometheus.GaugeValue, float64(st.resources))
}

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
)

// A category is where a CPU sample's time went: the first category, in this order, whose pattern
// matches a function on the sample's stack. The order puts what a stack is for before what it
// runs on: the garbage collector first (its assists run inside any allocation), then the zone
// token's check and the store, then gRPC's sends and receives (most called from the server's own
// goroutines), then a write's fan-out and the server's other work, then the rest of gRPC's,
// then the scheduler's.
type category struct {
	name string
	re   *regexp.Regexp
}

var categories = []category{
	{"garbage collection", regexp.MustCompile(`^runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge|gcStart|gcMarkDone|gcMarkTermination|markroot|sweepone|deductSweepCredit)$`)},
	{"zone token checks", regexp.MustCompile(`^github\.com/kds-host/kds-host/host/auth\.`)},
	{"heartbeat and store", regexp.MustCompile(`^github\.com/kds-host/kds-host/host/controlplane\.\(\*replicas\)|^github\.com/kds-host/kds-host/host/store\.|^modernc\.org/sqlite`)},
	{"stack growth", regexp.MustCompile(`^runtime\.(newstack|copystack)$|^github\.com/kds-host/kds-host/engine\.growStack$`)},
	{"gRPC sends (SendMsg, loopy writer)", regexp.MustCompile(`^google\.golang\.org/grpc\.\(\*serverStream\)\.SendMsg$|^google\.golang\.org/grpc/internal/transport\.\(\*loopyWriter\)|^google\.golang\.org/grpc/internal/transport\.\(\*http2Server\)\.(write|writeHeader)`)},
	{"gRPC receives (RecvMsg, frame reader)", regexp.MustCompile(`^google\.golang\.org/grpc\.\(\*serverStream\)\.RecvMsg$|^google\.golang\.org/grpc/internal/transport\.\(\*http2Server\)\.(HandleStreams|operateHeaders)$|^golang\.org/x/net/http2`)},
	{"a write's fan-out, but for gRPC", regexp.MustCompile(`\.\(\*Cache\)\.SetSnapshot(\.func\d+)*$|^github\.com/kds-host/kds-host/host/controlplane\.\(\*Global\)\.sync`)},
	{"the server's own request and cache work", regexp.MustCompile(`^github\.com/kds-host/kds-host/|^github\.com/envoyproxy/go-control-plane/pkg/|^main\.`)},
	{"gRPC, the rest (connections, stream setup)", regexp.MustCompile(`^google\.golang\.org/grpc`)},
	{"scheduler, network poller", regexp.MustCompile(`^runtime\.(schedule|findRunnable|park_m|goexit0|netpoll|mcall|wakep|startm|stopm)$`)},
}

const otherCategory = "other"

// breakdown prints, for each CPU profile, the seconds of its samples in each category, a column a
// profile; it reads each through `go tool pprof -traces`.
func breakdown(w io.Writer, profiles []string) error {
	cols := make([]map[string]float64, len(profiles))
	for i, p := range profiles {
		out, err := exec.Command("go", "tool", "pprof", "-traces", p).Output()
		if err != nil {
			return fmt.Errorf("go tool pprof -traces %s: %w", p, err)
		}
		if cols[i], err = classifyTraces(strings.NewReader(string(out))); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "seconds of CPU samples\t")
	for _, p := range profiles {
		fmt.Fprintf(tw, "%s\t", strings.TrimSuffix(filepath.Base(p), ".pprof"))
	}
	fmt.Fprintln(tw)
	names := make([]string, 0, len(categories)+2)
	for _, c := range categories {
		names = append(names, c.name)
	}
	names = append(names, otherCategory, "total")
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t", n)
		for _, col := range cols {
			fmt.Fprintf(tw, "%.2f\t", col[n])
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// classifyTraces reads `go tool pprof -traces` output: a header, then samples between
// "-----------+---..." lines, each a first line "<value><unit> <leaf function>" and one caller a
// line. It returns the seconds in each category, and in "total".
func classifyTraces(r io.Reader) (map[string]float64, error) {
	secs := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var value float64
	var stack []string
	inSample := false
	flush := func() {
		if inSample && value >= 0 { // pprof ends its output with a separator
			c := classify(stack)
			secs[c] += value
			secs["total"] += value
		}
		inSample, stack = false, stack[:0]
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----------+") {
			flush()
			inSample = true
			value = -1
			continue
		}
		if !inSample {
			continue // the header
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if value < 0 {
			v, err := parseDuration(fields[0])
			if err != nil {
				return nil, fmt.Errorf("sample line %q: %w", line, err)
			}
			value, fields = v, fields[1:]
		}
		if len(fields) > 0 {
			stack = append(stack, fields[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()
	return secs, nil
}

// classify names the category of a stack (leaf first).
func classify(stack []string) string {
	for _, c := range categories {
		for _, fn := range stack {
			if c.re.MatchString(fn) {
				return c.name
			}
		}
	}
	return otherCategory
}

// parseDuration reads pprof's "10ms", "1.50s", "250us".
func parseDuration(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		scale  float64
	}{{"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}, {"s", 1}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return 0, err
			}
			return v * u.scale, nil
		}
	}
	return 0, fmt.Errorf("%q: not a duration pprof writes", s)
}

func breakdownMain(profiles []string) {
	if len(profiles) == 0 {
		fmt.Fprintln(os.Stderr, "scale: -breakdown: name the CPU profiles to read after the flags")
		os.Exit(2)
	}
	if err := breakdown(os.Stdout, profiles); err != nil {
		fmt.Fprintln(os.Stderr, "scale: -breakdown:", err)
		os.Exit(1)
	}
}

package main

import (
	"strings"
	"testing"
)

func TestClassifyTraces(t *testing.T) {
	const traces = `File: benchserver
Type: cpu
Duration: 699.41ms, Total samples = 60ms ( 8.58%)
-----------+-------------------------------------------------------
      10ms   crypto/internal/fips140/edwards25519/field.feSquare
             github.com/kds-host/kds-host/host/auth.verifyBatch
             github.com/kds-host/kds-host/host/auth.(*Keys).Verify
             github.com/kds-host/kds-host/host/kds.(*ads).DeltaAggregatedResources
             google.golang.org/grpc.(*Server).processRPC
-----------+-------------------------------------------------------
      20ms   runtime.spanOf (inline)
             runtime.scanObject
             runtime.gcAssistAlloc1
             runtime.gcAssistAlloc
             runtime.mallocgc
             github.com/kds-host/kds-host/host/kds.(*Cache).evaluateLocked
-----------+-------------------------------------------------------
     1.5s   github.com/kds-host/kds-host/host/kds.perKind[go.shape.struct { once sync.Once }]
             google.golang.org/grpc.(*Server).processRPC
-----------+-------------------------------------------------------
     250us   internal/runtime/syscall/linux.Syscall6
             google.golang.org/grpc/internal/transport.(*loopyWriter).run
-----------+-------------------------------------------------------
      30ms   google.golang.org/grpc.(*parser).recvMsg
             google.golang.org/grpc.(*serverStream).RecvMsg
             github.com/kds-host/kds-host/host/kds.serveDelta.func2
-----------+-------------------------------------------------------
       5ms   github.com/kds-host/kds-host/host/kds.(*Cache).answerWrite
             github.com/kds-host/kds-host/host/kds.(*Cache).SetSnapshot.func1
             github.com/kds-host/kds-host/host/kds.(*Cache).each.func1
-----------+-------------------------------------------------------
       7ms   google.golang.org/grpc.(*serverStream).SendMsg
             github.com/kds-host/kds-host/host/kds.(*deltaStream).sendNow
             github.com/kds-host/kds-host/host/kds.(*Cache).SetSnapshot.func1
-----------+-------------------------------------------------------
      40ms   google.golang.org/grpc.(*Server).handleStream
             google.golang.org/grpc.(*Server).serveStreams.func2.1
-----------+-------------------------------------------------------
      10ms   runtime.futex
             runtime.sysmon
-----------+-------------------------------------------------------
       2ms   github.com/kds-host/kds-host/engine.growStack
             github.com/kds-host/kds-host/engine.(*ads).DeltaAggregatedResources
             google.golang.org/grpc.(*Server).processRPC
-----------+-------------------------------------------------------
`
	got, err := classifyTraces(strings.NewReader(traces))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"zone token checks":                          0.010,
		"garbage collection":                         0.020, // its assist, inside kds-host's allocation
		"the server's own request and cache work":    1.5,
		"gRPC sends (SendMsg, loopy writer)":         0.00725, // the fan-out's send among them
		"a write's fan-out, but for gRPC":            0.005,
		"gRPC receives (RecvMsg, frame reader)":      0.030, // on kds-host's goroutine
		"gRPC, the rest (connections, stream setup)": 0.040,
		"stack growth":                               0.002, // the engine's own, before the runtime's
		otherCategory:                                0.010,
		"total":                                      1.62425,
	}
	for k, v := range want {
		if d := got[k] - v; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: %.5f s, want %.5f", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("categories %v, want %v", got, want)
	}
}

func TestParseDurationRefusesWhatPprofDoesNotWrite(t *testing.T) {
	for _, s := range []string{"10", "ms", "1.5h", ""} {
		if _, err := parseDuration(s); err == nil {
			t.Errorf("parseDuration(%q): no error", s)
		}
	}
}

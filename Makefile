# kds-host: `make run` starts a global and a zone locally; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
TOOLS := $(BIN)/tools
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
TEST_TIMEOUT ?= 18m

FUZZTIME ?= 20s

NODE_RETRY := examples/plugins/node-retry

.PHONY: all build tools proto lint test-deps test bench bench-guard fuzz run repro repro-compare replicas chaos clean example-plugins

all: build

build: ## kds-host and the two reference plugins into bin/
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/kds-host ./host/cmd/kds-host
	$(GO) build -o $(BIN)/retry-forcer ./plugins/retry-forcer
	$(GO) build -o $(BIN)/owner-check ./plugins/owner-check

example-plugins: ## every example plugin into bin/: fixed-retry (Go) and node-retry (Node.js: npm ci from the npm registry, once per package-lock.json)
	$(GO) build -o $(BIN)/fixed-retry ./examples/plugins/fixed-retry
	@if command -v npm >/dev/null && command -v node >/dev/null; then \
	  $(MAKE) --no-print-directory $(NODE_RETRY)/node_modules/.package-lock.json && ln -sf ../$(NODE_RETRY)/plugin.js $(BIN)/node-retry; \
	elif [ -n "$$CI" ]; then echo "example-plugins: node and npm are required under CI (Debian: apt-get install nodejs npm)"; exit 1; \
	else echo "example-plugins: node or npm is missing, bin/node-retry is not built (Debian: apt-get install nodejs npm); its tests skip"; fi

$(NODE_RETRY)/node_modules/.package-lock.json: $(NODE_RETRY)/package-lock.json $(NODE_RETRY)/package.json
	cd $(NODE_RETRY) && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

tools: ## pinned generators and linters (tools/go.mod) into bin/tools
	cd tools && $(GO) build -o $(TOOLS)/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc honnef.co/go/tools/cmd/staticcheck

proto: tools ## regenerate the Go code beside every .proto (needs protoc: apt-get install protobuf-compiler)
	PATH="$(TOOLS):$$PATH" protoc -I proto \
		--go_out=. --go_opt=module=github.com/kds-host/kds-host \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kds-host/kds-host \
		$$(find proto -name '*.proto' | sort)

lint: tools ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...

test-deps: ## install what the tests need when it is missing: protoc, PostgreSQL 15 and its user, Node.js, Chromium, curl, promtool (as root; otherwise it says what to run)
	./scripts/setup-test-deps.sh

test: test-deps tools example-plugins ## every test, with -race (PostgreSQL is started by the tests themselves; the Node.js plugin's tests need node and npm)
	PATH="$(TOOLS):$$PATH" $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

fuzz: ## every fuzz target for FUZZTIME each (make test runs their seed corpora)
	@set -e; for t in \
	  ./host/auth:FuzzVerify ./host/kds:FuzzNACK ./host/zone:FuzzDecode \
	  ./host/api:FuzzDocuments ./plugins/retry-forcer/retrypolicy:FuzzParse; do \
	  pkg=$${t%%:*}; fn=$${t##*:}; echo "fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

BENCH_RUNS ?= 1
BENCH_ARGS ?=
bench: ## examples/bench/scale (kds-host, holds on and off, against stock go-control-plane; figures under bench-results/), then every go test benchmark; see docs/benchmarks.md
	$(GO) build -o $(BIN)/bench/ ./examples/bench/scale ./examples/bench/benchserver ./examples/bench/stock
	$(BIN)/bench/scale -bin $(BIN)/bench -runs $(BENCH_RUNS) -out bench-results $(BENCH_ARGS)
	$(MAKE) --no-print-directory bench-guard
	$(GO) test -run '^$$' -bench . -benchmem ./...

run: build ## a global and a zone on this machine, SQLite under .data/; Ctrl-C stops both
	./examples/run-local.sh

repro: build ## the Kuma retry stall and its fix, with two control planes on loopback (examples/repro)
	./examples/repro/two-cp.sh --no-build $(REPRO_ARGS)

GUARD_BENCH_ARGS ?=
bench-guard: ## examples/bench/guardfleet: examples/xds-server with the guard on and off beside a stock go-control-plane server, over a SnapshotCache, LinearCaches and a MuxCache, to 1,000 and 10,000 SotW and 10,000 delta clients (figures under bench-results/guardfleet/); see docs/benchmarks.md
	$(GO) build -o $(BIN)/bench/ ./examples/bench/guardfleet ./examples/xds-server
	$(BIN)/bench/guardfleet -bin $(BIN)/bench -runs $(BENCH_RUNS) -out bench-results/guardfleet $(GUARD_BENCH_ARGS)

repro-compare: build ## every retry mode side by side: convergence time, NACKs, rounds; a timeline SVG per scenario under bench-results/repro/
	./examples/repro/compare.sh $(REPRO_ARGS)

CHAOS_TIME ?= 30s
CHAOS_SEED ?= 1
chaos: build ## a soak under random faults: two replicas on a throwaway PostgreSQL, zones behind fault proxies, steady writes, slow zones, bad rows; checks nothing acknowledged is lost, reports write latency to healthy zones (CHAOS_TIME=10m for the long one)
	$(GO) run ./examples/chaos -time $(CHAOS_TIME) -seed $(CHAOS_SEED) -bin $(BIN) $(CHAOS_ARGS)

replicas: build ## three global replicas on a throwaway PostgreSQL, two zones, a replica killed under a zone (examples/replicas)
	./examples/replicas/replicas.sh --no-build $(REPLICAS_ARGS)

clean:
	rm -rf $(BIN) .data $(NODE_RETRY)/node_modules

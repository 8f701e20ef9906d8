# make test is the command the README gives users and the one CI runs.
GO ?= go
REDIS_SERVER ?= redis-server
CHROMIUM ?= chromium

.PHONY: test deps vet unit bench-unit e2e cluster test-cluster bench bench-engine bench-queue bench-worker bench-fleet adapt-plot

# CLUSTER_PKGS run their suites a second time on a local three-master Redis
# Cluster. A package opts in by taking redistest.UniversalClient in its
# tests (see internal/redistest).
CLUSTER_PKGS ?= ./throttle/ ./queue/ ./worker/

test: deps vet unit bench-unit e2e cluster

# deps makes sure every program the tests start is present: redis-server
# and Chromium (for the dashboard's browser test) come from the system's
# packages. As root they are installed; otherwise the message says exactly
# what to install.
deps:
	@if ! command -v $(REDIS_SERVER) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
			echo "redis-server not found: installing it with apt-get"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null || exit 1; \
		else \
			echo "redis-server (Redis 7 or newer) is needed by the tests and is not on PATH."; \
			echo "Install it: sudo apt-get install redis-server  (Debian/Ubuntu)"; \
			echo "            brew install redis                  (macOS)"; \
			exit 1; \
		fi; \
	fi
	@$(REDIS_SERVER) --version
	@if ! command -v $(CHROMIUM) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
			echo "chromium not found: installing it with apt-get"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null || exit 1; \
		else \
			echo "chromium is needed by the dashboard's browser test (make e2e) and is not on PATH."; \
			echo "Install it: sudo apt-get install chromium  (Debian/Ubuntu)"; \
			echo "            or set CHROMIUM=/path/to/chrome"; \
			exit 1; \
		fi; \
	fi
	@$(CHROMIUM) --version 2>/dev/null

vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd e2e && $(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 15m ./...

# The benchmark programs live in their own module (bench/go.mod), so that
# the library's users inherit nothing only they use; their tests (a tiny
# fleet run included) run here.
bench-unit: deps
	cd bench && $(GO) test -race -count=1 -timeout 10m ./...

# e2e is the dashboard's browser test, in its own module (e2e/go.mod) so
# that the library's users do not inherit the browser driver: the real
# redis-server, worker and sluice dashboard, driven in headless Chromium
# (about a minute). Without -race: it drives processes; the dashboard's
# own code runs under -race in unit. make e2e ARGS=-update-screenshot
# rewrites docs/img/dashboard*.png.
e2e: deps
	cd e2e && CHROMIUM="$$(command -v $(CHROMIUM))" $(GO) test -count=1 -timeout 5m ./... $(ARGS)

# cluster is the Cluster pass: SLUICE_TEST_CLUSTER=1 makes the shared test
# client a Cluster client. Its packages run one at a time (-p 1): their
# timed tests (a fleet's smoothness, a recovery within its lease, a raised
# rate followed within a second) share the machine with a three-master
# Cluster, and two packages under -race beside it made them miss on a
# loaded 2-core machine. In make test it runs -short: throttle's randomized
# model and property tests take a third to an eighth of their steps and
# trials there (they run in full on one server in unit), and the million-
# job line is not built again; TestClusterMatchesSingleNode keeps its
# depth. test-cluster is the full Cluster pass.
cluster: deps
	SLUICE_TEST_CLUSTER=1 $(GO) test -race -short -p 1 -count=1 -timeout 10m $(CLUSTER_PKGS)

test-cluster: deps
	SLUICE_TEST_CLUSTER=1 $(GO) test -race -p 1 -count=1 -timeout 15m $(CLUSTER_PKGS)

# bench runs the engine's, the producer's and the worker gate's benchmarks
# (BENCHMARKS.md); the fleet benchmark has its own target.
bench: bench-engine bench-queue bench-worker

bench-engine: deps
	cd bench && $(GO) test -run '^$$' -bench Decisions -benchtime 7x ./engine/
	$(GO) test -run '^$$' -bench TenantMemory ./throttle/
	$(GO) test -run '^$$' -bench KeyMemory -benchtime 1x ./throttle/
	$(GO) test -run '^$$' -bench Turn -benchtime 5000x ./throttle/

bench-queue: deps
	$(GO) test -run '^$$' -bench Enqueue -benchtime 5x ./queue/

bench-worker: deps
	$(GO) test -run '^$$' -bench Gate -benchtime 5x ./worker/

# bench-fleet is the fleet benchmark: 1,000 tenants and 200,000 jobs
# through asynq + x/time/rate, asynq + redis_rate and sluice, each with its
# own redis-server, worker processes and strict downstream, side by side
# (20–30 minutes). It rewrites docs/benchmarks.md and docs/img/fleet-*.png.
# bench-fleet-small is the scaled-down smoke run (100 tenants, 15,000 jobs,
# a few minutes); it writes its report to a temporary directory.
.PHONY: bench-fleet-small
bench-fleet: deps
	cd bench && $(GO) run ./fleet -config full -allowance 2ms -out ../docs

bench-fleet-small: deps
	@out=$$(mktemp -d) && cd bench && $(GO) run ./fleet -config small -out "$$out"

# adapt-plot runs the adaptive limits' convergence test (worker's
# TestAdaptiveConvergence) with 15-second phases instead of make test's
# few seconds, and draws the run in docs/adaptive.svg.
adapt-plot: deps
	$(GO) test -count=1 -run 'TestAdaptiveConvergence$$' -v ./worker/ -args -adapt-phase=15s -adapt-svg=$(CURDIR)/docs/adaptive.svg

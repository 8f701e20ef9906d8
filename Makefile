# make test is the command the README gives users and the one CI runs.
GO ?= go
REDIS_SERVER ?= redis-server
CHROMIUM ?= chromium
PROMTOOL ?= promtool
PROMETHEUS ?= prometheus
# IMAGE is the name make image tags the image with.
IMAGE ?= sluice

.PHONY: test deps vet unit bench-unit e2e deploy image image-test cluster test-cluster bench bench-engine bench-queue bench-worker bench-fleet adapt-plot

# CLUSTER_PKGS run their suites a second time on a local three-master Redis
# Cluster. A package opts in by taking redistest.UniversalClient in its
# tests (see internal/redistest).
CLUSTER_PKGS ?= ./throttle/ ./queue/ ./worker/

test: deps vet unit bench-unit e2e deploy image-test cluster

# deps makes sure every program the tests start is present: redis-server,
# Chromium (for the dashboard's browser test) and Prometheus's server and
# promtool (the dashboard's history test, the alert rules' tests; Debian's
# prometheus package has both) come from the system's packages. As root
# they are installed; otherwise the message says exactly what to install.
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
	@if ! command -v $(PROMTOOL) >/dev/null 2>&1 || ! command -v $(PROMETHEUS) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
			echo "prometheus or promtool not found: installing Debian's prometheus package with apt-get"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null || exit 1; \
		else \
			echo "prometheus and promtool are needed by the tests (the dashboard's history, the alert rules) and are not on PATH."; \
			echo "Install them: sudo apt-get install prometheus   (Debian/Ubuntu: the server and promtool)"; \
			echo "              brew install prometheus           (macOS)"; \
			echo "              or set PROMETHEUS=/path/to/prometheus PROMTOOL=/path/to/promtool"; \
			exit 1; \
		fi; \
	fi
	@$(PROMTOOL) --version 2>&1 | head -1

vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	cd e2e && $(GO) vet ./...
	cd deploy && $(GO) vet ./...

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

# deploy checks deploy/ in its own module (deploy/go.mod: the PromQL
# parser is no dependency of the library's users): every command, flag,
# port and path of the Containerfile, the compose file and the Kubernetes
# manifests, run for real against the binaries (static, as in the image);
# every PromQL expression of the Grafana dashboard and the alert rules
# parsed and checked against a running worker's /metrics, as is
# docs/metrics.md's table; promtool's unit tests of the rules; go install
# of the commands at a version from a module proxy in a directory
# (about 20 s once built; the first build of the static binaries takes a
# few minutes).
deploy: deps
	cd deploy && PATH="$$(dirname "$$(command -v $(PROMTOOL))"):$$PATH" $(GO) test -count=1 -timeout 10m ./...

# CONTAINER_ENGINE is podman, else docker when its engine answers; empty
# when neither can build an image here.
CONTAINER_ENGINE ?= $(shell if command -v podman >/dev/null 2>&1; then echo podman; elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker; fi)

# image builds the container image (deploy/Containerfile) from static
# binaries built here, and tags it $(IMAGE):VERSION, VERSION being what
# sluice version prints (the module's version: a pseudo-version from a
# checkout, +dirty written -dirty), and $(IMAGE):latest. No registry is
# needed: the image starts FROM scratch.
image:
	@if [ -z "$(CONTAINER_ENGINE)" ]; then \
		echo "make image needs podman, or docker with a running engine: neither is here"; exit 1; \
	fi
	rm -rf deploy/.build && mkdir -p deploy/.build
	CGO_ENABLED=0 GOFLAGS=-buildvcs=auto $(GO) build -trimpath -ldflags "-s -w" -o deploy/.build/ ./cmd/worker ./cmd/enqueue ./cmd/sluice
	@for ca in /etc/ssl/certs/ca-certificates.crt /etc/ssl/cert.pem /etc/pki/tls/certs/ca-bundle.crt; do \
		if [ -f "$$ca" ]; then cp "$$ca" deploy/.build/ca-certificates.crt; break; fi; \
	done; \
	if [ ! -f deploy/.build/ca-certificates.crt ]; then \
		echo "no CA bundle found for rediss:// in the image: install ca-certificates"; exit 1; \
	fi
	@version=$$(deploy/.build/sluice version | cut -d' ' -f2); \
	tag=$$(printf '%s' "$$version" | tr -c 'A-Za-z0-9_.-' '-' | sed 's/^[-.]*//; s/-*$$//' | cut -c1-128); \
	format=; if [ "$(CONTAINER_ENGINE)" = podman ]; then format="--format docker"; fi; \
	echo "building $(IMAGE):$$tag (sluice $$version) with $(CONTAINER_ENGINE)"; \
	$(CONTAINER_ENGINE) build $$format -q -f deploy/Containerfile --build-arg VERSION="$$version" \
		-t $(IMAGE):"$$tag" -t $(IMAGE):latest deploy/.build && \
	$(CONTAINER_ENGINE) image inspect --format 'image $(IMAGE):'"$$tag"': user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}, health check {{.Config.Healthcheck.Test}}' $(IMAGE):"$$tag"

# image-test builds the image in make test when podman or docker can, and
# says plainly when it was not built.
image-test:
	@if [ -n "$(CONTAINER_ENGINE)" ]; then \
		$(MAKE) --no-print-directory image; \
	else \
		echo "NOT BUILT: the container image (neither podman nor docker with a running engine is here; make image builds it where one is)"; \
	fi

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

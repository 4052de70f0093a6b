# Quarry — see README.md. Every target works on a fresh machine with Go installed.
SHELL := /bin/bash
GO ?= go
BIN := bin

.PHONY: all build lambda run test unit fuzz faults soak flake-hunt bench bench-scale bench-images lint clean

all: build

build: ## build the gateway, the exec agent (static) and the CLI into bin/
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/execagent ./cmd/execagent
	$(GO) build -o $(BIN)/gateway ./cmd/gateway
	$(GO) build -o $(BIN)/quarry ./cmd/quarry

lambda: ## the gateway for AWS Lambda (provided.al2023): bin/lambda/gateway.zip with a static bootstrap (GOARCH=arm64 by default)
	@mkdir -p $(BIN)/lambda
	GOOS=linux GOARCH=$${GOARCH:-arm64} CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' -o $(BIN)/lambda/bootstrap ./cmd/gateway
	cd $(BIN)/lambda && rm -f gateway.zip && python3 -m zipfile -c gateway.zip bootstrap
	@echo "$(BIN)/lambda/gateway.zip: use it as the module's lambda_zip (docs/DEPLOY.md)"

run: build ## start the gateway on embedded defaults (process provider, embedded store in ./.quarry)
	./scripts/run.sh

test: ## everything CI runs: vet, unit and integration suites with their real dependencies
	./scripts/test.sh

fuzz: ## fuzz every parser of untrusted input (Go fuzz targets), FUZZTIME each (default 8s; make test runs it too); FUZZ selects targets
	./scripts/fuzz.sh

faults: ## three replicas on DynamoDB under a seeded nemesis (kills, pauses, store faults, killed sandboxes), the history checked: DURATION (default 10m), SEED, CLIENTS, KINDS
	./scripts/faults.sh

soak: ## one gateway under steady load (acquires, commands, PTYs, ports, releases, killed sandboxes) for DURATION (default 30m); fails on RSS, goroutine or file growth after warm-up
	./scripts/soak.sh

flake-hunt: ## make test's race-enabled suites COUNT times (default 20) under CPU pressure (stress-ng); PKGS, RUN, SUITE, STRESS=0
	./scripts/flake-hunt.sh

unit: ## go vet + unit tests only (needs nothing but Go)
	$(GO) vet ./...
	$(GO) test ./...

bench: build ## benchmarks with p50/p99 and ratios (see docs/BENCHMARKS.md)
	./scripts/bench.sh

bench-images: build ## images on demand on Docker with a local registry: 200 images, 1,000 sandboxes, no prefetch / prefetch / configured pools side by side (flags: scripts/bench-images.sh -h)
	./scripts/bench-images.sh

bench-scale: ## the fleet simulation at 1k, 4k and 10k sandboxes (simulated ECS, agents and DynamoDB; real gateways): SIZES, TIME_SCALE, REPLICAS
	./scripts/bench-scale.sh

lint: ## formatting and vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean: ## stop sandboxes left by `make run` and remove build output
	-./scripts/stop-sandboxes.sh
	rm -rf $(BIN) .quarry

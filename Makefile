# One command per task; CI calls these verbatim.
PY ?= .venv/bin/python

.PHONY: gen gen-check map lint test bench demo setup

gen:            ## regenerate sandbox/_proto and clients/typescript/src/gen from proto/
	$(PY) scripts/gen_protos.py
	cd clients/typescript && npm run --silent gen

gen-check: gen  ## fail when the generated code differs from what is committed
	git diff --exit-code -- sandbox/_proto || (echo "sandbox/_proto is stale: run make gen" >&2; exit 1)
	test -z "$$(git status --porcelain -- sandbox/_proto)" || (echo "sandbox/_proto has untracked files: run make gen" >&2; exit 1)
	git diff --exit-code -- clients/typescript/src/gen || (echo "clients/typescript/src/gen is stale: run make gen" >&2; exit 1)
	test -z "$$(git status --porcelain -- clients/typescript/src/gen)" || (echo "clients/typescript/src/gen has untracked files: run make gen" >&2; exit 1)

map:            ## write docs/architecture.md's floors from the import graph (tests/test_layers.py)
	$(PY) -m tests.test_layers

lint:
	$(PY) -m ruff format --check sandbox stubs_gen tests bench scripts examples setup.py
	$(PY) -m ruff check sandbox stubs_gen tests bench scripts examples setup.py
	$(PY) -m mypy
	cd clients/typescript && npm run --silent typecheck && npm run --silent lint

setup:          ## venv and system packages for running
	./scripts/setup.sh

# Without root there are no cgroups to delegate: the demo then says so and runs on rlimits.
DEGRADED := $(if $(filter 0,$(shell id -u)),,--allow-degraded)

demo: setup     ## the main job: one script through the embedded default (process backend)
	.venv/bin/ptc run examples/weather.py --tools examples/weather_tools.json $(DEGRADED)

test:           ## all set-up on a fresh machine, then the whole test suite
	./scripts/test.sh $(ARGS)

bench:          ## every benchmark; figures and ratios measured in the same run
	$(PY) -m bench.stubs
	$(PY) -m bench.sandbox
	$(PY) -m bench.forkserver
	$(PY) -m bench.forkserver_cost
	$(PY) -m bench.grpc
	$(PY) -m bench.tokens
	$(PY) -m bench.audit
	$(PY) -m bench.checkpoints
	$(PY) -m bench.docker
	$(PY) -m bench.runtimes
	$(PY) -m bench.fleet
	$(PY) -m bench.sessions
	$(PY) -m bench.session_rebuild
	$(PY) -m bench.files
	$(PY) -m bench.output
	$(PY) -m bench.tracing
	$(PY) -m bench.boundary
	cd clients/typescript && npm run --silent bench

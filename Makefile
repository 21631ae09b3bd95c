# The two commands: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
# uv from PATH, or installed from PyPI (pinned) on first use: see scripts/uv.
UV := scripts/uv
RUN := $(UV) run --frozen

.PHONY: system system-test deps demo demo-copy-guard demo-admission down lint test test-unit bench bench-alert-latency bench-controller-scale bench-accesslog bench-copy-guard bench-nginx-tuner bench-rca bench-admission bench-swift bench-swift-decode bench-ha-delivery dashboards clean

# The Debian packages that are missing (scripts/install-system.sh, by profile), then the Python
# environment from uv.lock: the runtime dependencies and the dev group (tests, linters, dashboards
# builder). The demo needs the base profile; the tests also run Swift and the PHP shop for real.
system:
	scripts/install-system.sh base

system-test:
	scripts/install-system.sh base swift shop tshark

deps: system
	$(UV) sync --frozen

demo: deps
	$(RUN) promreflex stack up

down:
	$(RUN) promreflex stack down

# Lint and type check first (seconds), then the rules, the dashboards, the tests.
lint: deps
	$(RUN) ruff check .
	$(RUN) mypy

test: system-test lint
	promtool check rules rules/*.yml
	promtool test rules rules/tests/*.yml
	$(RUN) python -m dashboards.build --check
	$(RUN) python -m promreflex compose build --check
	$(RUN) python -m promreflex kube build --check
	$(RUN) pytest
	scripts/test-system-python.sh

test-unit: deps
	$(RUN) pytest tests/unit

# The copy-guard scenario, short: the shop, a copy, load, with and without the guard; prints the
# table and writes bench/results/copy_guard/builtin/quick/timeline.png.
demo-copy-guard: deps
	$(RUN) python -m bench.copy_guard --quick

# The flash crowd with and without session admission (seed 002), short; prints the table.
# Under the heavy lock like every load run (the proxy with its shipped defaults).
demo-admission: deps
	$(RUN) python -m bench.admission --demo --lock /tmp/promreflex-heavy.lock

# Benchmarks: each takes the machine for a few minutes (one at a time, under a lock). They need
# only the runtime dependencies (locust and matplotlib are the product's too), so no group of
# their own: `uv run --frozen --no-dev` would do, the dev group is simply already there.
BENCH_LOCK := flock /tmp/promreflex-heavy.lock
bench: bench-alert-latency bench-controller-scale bench-accesslog bench-copy-guard bench-nginx-tuner bench-rca bench-admission bench-swift bench-swift-decode bench-ha-delivery

bench-alert-latency: deps
	$(BENCH_LOCK) $(RUN) python -m bench.alert_latency

bench-controller-scale: deps
	$(BENCH_LOCK) $(RUN) python -m bench.controller_scale --out bench/results/controller_scale/summary.json

bench-accesslog: deps
	$(BENCH_LOCK) $(RUN) python -m bench.accesslog

# Takes the heavy lock itself, in chunks (--lock), so other benches can run in between.
bench-copy-guard: deps
	scripts/install-system.sh shop
	$(RUN) python -m bench.copy_guard --shop wordpress --lock /tmp/promreflex-heavy.lock
	$(RUN) python -m bench.copy_guard --shop builtin --copy-gib 0.75 --lock /tmp/promreflex-heavy.lock

bench-nginx-tuner: deps
	$(BENCH_LOCK) $(RUN) python -m bench.nginx_tuner

bench-rca: deps
	$(BENCH_LOCK) $(RUN) python -m bench.rca

# The measured run in the README (~20 min; the proxy with its shipped defaults, no --proxy-set).
bench-admission: deps
	$(RUN) python -m bench.admission --lock /tmp/promreflex-heavy.lock --multiples 1,4,2,0.5,3 --var-multiples 4,1 --warmup 60 --window 100 --recalibrate --fresh

# The Swift lab (network namespaces, root) up, the PUT/GET sweep and the injections, the lab down.
bench-swift: deps
	scripts/install-system.sh swift
	$(RUN) promreflex swift-lab up
	$(RUN) python -m bench.swift all --lock /tmp/promreflex-heavy.lock; status=$$?; $(RUN) promreflex swift-lab down; exit $$status

bench-swift-decode: deps
	scripts/install-system.sh swift tshark
	$(BENCH_LOCK) $(RUN) python -m bench.swift_decode

bench-ha-delivery: deps
	$(BENCH_LOCK) $(RUN) python -m bench.ha_delivery --interval 1s --flips 6 --out bench/results/ha_delivery/interval-1s
	$(BENCH_LOCK) $(RUN) python -m bench.ha_delivery --interval 15s --flips 2 --settle 15 --out bench/results/ha_delivery/interval-15s

dashboards: deps
	$(RUN) python -m dashboards.build

# Removes what git ignores there (state, raw bench output); the committed summaries stay.
clean:
	git clean -fdX -- .promreflex bench/results

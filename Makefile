# The two commands: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
# uv from PATH, or installed from PyPI (pinned) on first use: see scripts/uv.
UV := scripts/uv
RUN := $(UV) run --frozen

.PHONY: system deps demo demo-copy-guard down lint test test-unit bench bench-alert-latency bench-controller-scale bench-accesslog bench-copy-guard bench-nginx-tuner bench-rca dashboards clean

# The Debian packages that are missing (scripts/install-system.sh), then the Python environment
# from uv.lock: the runtime dependencies and the dev group (tests, linters, dashboards builder).
system:
	scripts/install-system.sh

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

test: lint
	promtool check rules rules/*.yml
	promtool test rules rules/tests/*.yml
	$(RUN) python -m dashboards.build --check
	$(RUN) pytest

test-unit: deps
	$(RUN) pytest tests/unit

# The copy-guard scenario, short: the shop, a copy, load, with and without the guard; prints the
# table and writes bench/results/copy_guard/quick/timeline.png.
demo-copy-guard: deps
	$(RUN) python -m bench.copy_guard --quick

# Benchmarks: each takes the machine for a few minutes (one at a time, under a lock). They need
# only the runtime dependencies (locust and matplotlib are the product's too), so no group of
# their own: `uv run --frozen --no-dev` would do, the dev group is simply already there.
BENCH_LOCK := flock /tmp/promreflex-heavy.lock
bench: bench-alert-latency bench-controller-scale bench-accesslog bench-copy-guard bench-nginx-tuner bench-rca

bench-alert-latency: deps
	$(BENCH_LOCK) $(RUN) python -m bench.alert_latency

bench-controller-scale: deps
	$(BENCH_LOCK) $(RUN) python -m bench.controller_scale --out bench/results/controller_scale/summary.json

bench-accesslog: deps
	$(BENCH_LOCK) $(RUN) python -m bench.accesslog

bench-copy-guard: deps
	$(BENCH_LOCK) $(RUN) python -m bench.copy_guard

bench-nginx-tuner: deps
	$(BENCH_LOCK) $(RUN) python -m bench.nginx_tuner

bench-rca: deps
	$(BENCH_LOCK) $(RUN) python -m bench.rca

dashboards: deps
	$(RUN) python -m dashboards.build

# Removes what git ignores there (state, raw bench output); the committed summaries stay.
clean:
	git clean -fdX -- .promreflex bench/results

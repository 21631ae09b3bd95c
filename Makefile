# The two commands: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
UV := $(shell scripts/ensure-uv.sh)
RUN := $(UV) run --frozen

.PHONY: deps demo demo-copy-guard down test test-unit bench bench-alert-latency bench-copy-guard bench-nginx-tuner bench-rca dashboards clean

deps:
	scripts/install-system.sh
	$(UV) sync --frozen

demo: deps
	$(RUN) promreflex stack up

down:
	$(RUN) promreflex stack down

test: deps
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

# Benchmarks: each takes the machine for a few minutes (one at a time, under a lock).
BENCH_LOCK := flock /tmp/promreflex-bench.lock
bench: bench-alert-latency bench-copy-guard bench-nginx-tuner bench-rca

bench-alert-latency: deps
	$(BENCH_LOCK) $(RUN) python -m bench.alert_latency

bench-copy-guard: deps
	$(BENCH_LOCK) $(RUN) python -m bench.copy_guard

bench-nginx-tuner: deps
	$(BENCH_LOCK) $(RUN) python -m bench.nginx_tuner

bench-rca: deps
	$(BENCH_LOCK) $(RUN) python -m bench.rca

dashboards:
	$(RUN) python -m dashboards.build

clean:
	rm -rf .promreflex bench/results

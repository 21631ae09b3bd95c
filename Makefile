# The two commands: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
UV := $(shell scripts/ensure-uv.sh)
RUN := $(UV) run --frozen

.PHONY: deps demo down test test-rules test-unit test-integration bench-alert-latency dashboards check-dashboards clean

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

bench-alert-latency: deps
	$(RUN) python -m bench.alert_latency

dashboards:
	$(RUN) python -m dashboards.build

clean:
	rm -rf .promreflex bench/results

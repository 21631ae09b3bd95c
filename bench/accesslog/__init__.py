"""Access-log exporter against mtail, in lines per CPU-second: ``python -m bench.accesslog``."""

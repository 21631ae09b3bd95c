"""Root-cause analysis on a real (simulated) mesh: a Sock-Shop-like set of services on
loopback with Istio-style sidecar logs, fault injection, a load driver and the experiments
(``uv run python -m bench.rca``)."""

"""The Swift bench (issue 14, seed 004): a PUT/GET sweep against the namespaced Swift lab
(``promreflex swift-lab up``), the curve beside the paper's, the capture exporter's per-node
breakdown at each level, and the slow-node / slow-link injections. ``python -m bench.swift``."""

"""The session admission bench (seed 002): :mod:`bench.admission.run`."""

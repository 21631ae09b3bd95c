"""Swift packet timing (exporters/swift): captures of several nodes -> per-hop transit and
per-node processing. ``lab*.py`` is the namespaced Swift that produces such captures.

The analysis does no linear algebra: numpy is told to start a single OpenBLAS thread (it starts
one per core at import otherwise: ~70 ms of CPU here, for nothing). Only effective when numpy is
not imported yet, and only for OpenBLAS's own threads.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

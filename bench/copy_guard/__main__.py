"""``python -m bench.copy_guard [--quick]``: see :mod:`bench.copy_guard.run`."""

from bench.copy_guard.run import main

raise SystemExit(main())

"""``python -m bench.admission [--demo]``: see :mod:`bench.admission.run`."""

from bench.admission.run import main

raise SystemExit(main())

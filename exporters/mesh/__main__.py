"""``python -m exporters.mesh --config.file mesh.yml``."""

import sys

from exporters.mesh.cli import main

sys.exit(main())

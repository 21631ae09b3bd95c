"""``python -m exporters.swift analyze|diagram|serve ...`` (the same as ``promreflex swift-timing``)."""

import sys

from exporters.swift.cli import main

sys.exit(main())

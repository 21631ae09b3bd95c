"""``python -m exporters.accesslog --config.file F`` or ``--log SITE=PATH[:FORMAT]``."""

import sys

from exporters.accesslog.cli import main

sys.exit(main())

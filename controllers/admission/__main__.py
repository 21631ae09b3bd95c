"""``python -m controllers.admission proxy|keygen ...``: ``promreflex admission ...`` without the
capability installed (the same parser and error handling, with only this capability)."""

import sys

from controllers.admission.manifest import CAPABILITY
from promreflex.cli import main

sys.exit(main(["admission", *sys.argv[1:]], capabilities=[CAPABILITY]))

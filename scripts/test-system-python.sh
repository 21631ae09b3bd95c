#!/usr/bin/env bash
# The log parsers' tests on the distribution's own python3 when it is a Python 3.11 (what uv picks
# on a machine that has no other): Debian 12 ships 3.11.2, whose re module matched possessive
# quantifiers and atomic groups wrongly (gh-100061, fixed in 3.11.5), and the access-log exporter
# rejected every line of the promreflex format there (promreflex/recompat.py emulates them). The
# project's own venv may use another interpreter (pyenv's, a newer one), so this runs in a venv of
# its own, from the same lock file, under the user's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PROMREFLEX_SYSTEM_PYTHON:-/usr/bin/python3}
if [ ! -x "$py" ]; then
  echo "test-system-python: no $py: nothing to check"
  exit 0
fi
ver=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
case "$ver" in
  3.11.*) ;;
  *) echo "test-system-python: $py is Python $ver, not a 3.11 this project runs on: nothing to check"; exit 0 ;;
esac
key=$(pwd | cksum | cut -d' ' -f1)
venv=${XDG_CACHE_HOME:-$HOME/.cache}/promreflex/system-python-$ver-$key
echo "test-system-python: the parsers' tests on $py (Python $ver), venv $venv"
UV_PROJECT_ENVIRONMENT=$venv scripts/uv sync --frozen --python "$py" --quiet
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/unit/test_accesslog_parse.py tests/unit/test_mesh_format.py \
  tests/unit/test_copy_guard_calibrate_replay.py tests/unit/test_accesslog_exporter.py tests/unit/test_recompat.py

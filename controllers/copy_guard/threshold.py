"""The calibrated threshold, published where the rules read it.

``promreflex calibrate`` measures the lowest served RPS of a healthy, loaded site and calls
:func:`write_threshold`, which writes a node_exporter textfile
(``<textfile_dir>/promreflex_copy_guard_threshold.prom``) holding, per site:

- ``promreflex_copy_guard_rps_threshold{site}``: below this served RPS the site suffers;
- ``promreflex_copy_guard_demand_floor_rps{site}``: below this demand the site is merely quiet
  (the rules never pause a copy for a quiet site; default: half the threshold);
- ``promreflex_copy_guard_calibration_timestamp_seconds{site}``: when it was measured.

One file for every site: writing one site keeps the others. The write is atomic (temporary file
in the same folder, renamed), so node_exporter never serves half a file.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from promreflex.fsutil import atomic_write_text

FILENAME = "promreflex_copy_guard_threshold.prom"
#: Default demand floor as a share of the threshold: under half the calibrated load, the site is
#: considered quiet (night time), whatever its RPS.
DEFAULT_FLOOR_RATIO = 0.5
SITE_RE = re.compile(r"^[a-zA-Z0-9_.-]+$")

_METRICS = {
    "rps": ("promreflex_copy_guard_rps_threshold",
            "Served requests per second below which the site suffers (calibrated; copy guard)."),
    "floor": ("promreflex_copy_guard_demand_floor_rps",
              "Demand (requests per second) below which the site is quiet and copies are never paused."),
    "when": ("promreflex_copy_guard_calibration_timestamp_seconds",
             "Unix time at which the threshold was calibrated."),
}
_SAMPLE = re.compile(r'^(\w+)\{site="([a-zA-Z0-9_.-]+)"\}\s+(\S+)\s*$')


@dataclass(frozen=True)
class Threshold:
    site: str
    rps: float
    demand_floor_rps: float
    when: float


def _check(site: str, rps: float, floor: float, when: float) -> None:
    if not SITE_RE.match(site):
        raise ValueError(f"site {site!r} must match {SITE_RE.pattern}")
    for name, value in (("rps", rps), ("demand floor", floor), ("timestamp", when)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"the {name} must be a finite number >= 0, not {value!r}")


def read_thresholds(textfile_dir: str | Path) -> dict[str, Threshold]:
    """Every site's threshold in the file (empty when there is none). Lines that do not parse
    are ignored: the file is ours and rewritten whole."""
    path = Path(textfile_dir) / FILENAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    by_name = {name: key for key, (name, _) in _METRICS.items()}
    values: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in by_name:
            try:
                values.setdefault(m.group(2), {})[by_name[m.group(1)]] = float(m.group(3))
            except ValueError:
                continue
    return {
        site: Threshold(site, v["rps"], v.get("floor", v["rps"] * DEFAULT_FLOOR_RATIO), v.get("when", 0.0))
        for site, v in values.items() if "rps" in v
    }


def render(thresholds: dict[str, Threshold]) -> str:
    lines = []
    for key, (name, help_text) in _METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for site in sorted(thresholds):
            t = thresholds[site]
            value = {"rps": t.rps, "floor": t.demand_floor_rps, "when": t.when}[key]
            lines.append(f'{name}{{site="{site}"}} {value!r}')
    return "\n".join(lines) + "\n"


def write_threshold(textfile_dir: str | Path, site: str, rps: float, *, when: float | None = None,
                    demand_floor_rps: float | None = None) -> Path:
    """Publish ``rps`` as the served-RPS threshold of ``site`` (atomic; other sites are kept).

    ``demand_floor_rps`` defaults to ``DEFAULT_FLOOR_RATIO * rps``; ``when`` to now. Returns the
    file written. Raises ValueError for a bad site name or a negative / non-finite number."""
    when = time.time() if when is None else when
    floor = rps * DEFAULT_FLOOR_RATIO if demand_floor_rps is None else demand_floor_rps
    _check(site, rps, floor, when)
    thresholds = read_thresholds(textfile_dir)
    thresholds[site] = Threshold(site, float(rps), float(floor), float(when))
    path = Path(textfile_dir) / FILENAME
    atomic_write_text(path, render(thresholds), mode=0o644)
    return path


def remove_threshold(textfile_dir: str | Path, site: str) -> bool:
    """Forget ``site``'s threshold (the ThresholdMissing alert then tells). True if it was there."""
    thresholds = read_thresholds(textfile_dir)
    if thresholds.pop(site, None) is None:
        return False
    path = Path(textfile_dir) / FILENAME
    if thresholds:
        atomic_write_text(path, render(thresholds), mode=0o644)
    else:
        path.unlink(missing_ok=True)
    return True

"""The calibrated threshold, published where the rules read it.

``promreflex calibrate`` measures the lowest served RPS of a healthy, loaded site and calls
:func:`write_threshold`, which writes a node_exporter textfile
(``<textfile_dir>/promreflex_copy_guard_threshold.prom``) holding, per site:

- ``promreflex_copy_guard_rps_threshold{site}``: below this served RPS the site suffers;
- ``promreflex_copy_guard_demand_floor_rps{site}``: the demand (visitors' requests per second)
  at or above which a site serving less than its threshold is overloaded; below it the site
  keeps up with what it is asked, and its copies are never paused (default: the threshold
  itself, issue 16: a floor of half the threshold called an ordinary moderately busy shop,
  which serves all it is asked, "overloaded" and throttled its backup);
- ``promreflex_copy_guard_response_time_seconds{site}`` (optional): the healthy response time
  at calibration (95th percentile, see ``calibrate``); the rules turn requests in flight into
  demand with it (Little's law: in flight / response time): the alerts count it in a stall,
  where visitors wait instead of arriving, the throttle of an open episode always;
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
#: Default demand floor as a share of the threshold: a site is overloaded only while visitors ask
#: for at least what a healthy site serves (its threshold); under that it keeps up with them.
DEFAULT_FLOOR_RATIO = 1.0
SITE_RE = re.compile(r"^[a-zA-Z0-9_.-]+$")

_METRICS = {
    "rps": ("promreflex_copy_guard_rps_threshold",
            "Served requests per second below which the site suffers (calibrated; copy guard)."),
    "floor": ("promreflex_copy_guard_demand_floor_rps",
              "Demand (requests per second) below which the site is quiet and copies are never paused."),
    "response": ("promreflex_copy_guard_response_time_seconds",
                 "Healthy response time at calibration (s, p95): requests in flight / this = demand (Little's law)."),
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
    response_s: float | None = None


def _check(site: str, rps: float, floor: float, when: float, response_s: float | None = None) -> None:
    if not SITE_RE.match(site):
        raise ValueError(f"site {site!r} must match {SITE_RE.pattern}")
    for name, value in (("rps", rps), ("demand floor", floor), ("timestamp", when)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"the {name} must be a finite number >= 0, not {value!r}")
    if response_s is not None and (isinstance(response_s, bool) or not isinstance(response_s, (int, float))
                                   or not math.isfinite(response_s) or response_s <= 0):
        raise ValueError(f"the response time must be a finite number > 0, not {response_s!r}")


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
        site: Threshold(site, v["rps"], v.get("floor", v["rps"] * DEFAULT_FLOOR_RATIO), v.get("when", 0.0),
                        v.get("response"))
        for site, v in values.items() if "rps" in v
    }


def render(thresholds: dict[str, Threshold]) -> str:
    lines = []
    for key, (name, help_text) in _METRICS.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for site in sorted(thresholds):
            t = thresholds[site]
            value = {"rps": t.rps, "floor": t.demand_floor_rps, "when": t.when, "response": t.response_s}[key]
            if value is not None:
                lines.append(f'{name}{{site="{site}"}} {value!r}')
    return "\n".join(lines) + "\n"


def write_threshold(textfile_dir: str | Path, site: str, rps: float, *, when: float | None = None,
                    demand_floor_rps: float | None = None, response_s: float | None = None) -> Path:
    """Publish ``rps`` as the served-RPS threshold of ``site`` (atomic; other sites are kept).

    ``demand_floor_rps`` defaults to ``DEFAULT_FLOOR_RATIO * rps``; ``when`` to now;
    ``response_s`` (the healthy response time) is left out when None. Returns the file
    written. Raises ValueError for a bad site name or a negative / non-finite number."""
    when = time.time() if when is None else when
    floor = rps * DEFAULT_FLOOR_RATIO if demand_floor_rps is None else demand_floor_rps
    _check(site, rps, floor, when, response_s)
    thresholds = read_thresholds(textfile_dir)
    thresholds[site] = Threshold(site, float(rps), float(floor), float(when),
                                 None if response_s is None else float(response_s))
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

"""One-shot backfill: the totals of a log's whole rotated set, plain and gzip, oldest first.

``promreflex exporter-accesslog --backfill --log shop=/var/log/nginx/access.log:nginx_timed``
reads ``access.log.14.gz ... access.log.2.gz, access.log.1, access.log`` (the names
:func:`promreflex.follow.rotated_siblings` finds, or the log's ``rotated:`` glob), counts them
with the same parser and counters as the follower, prints the totals as a Prometheus
exposition on stdout (ready for node_exporter's textfile collector) and one line per file on
stderr, and exits. Its line count equals ``zcat -f`` of the same files (a final line without a
newline counts too). Every file is checked before anything is counted: a compressed format
other than gzip, or binary data, is refused with an error naming the file.

It keeps no read position and does not touch the follower's: backfill totals are a separate
number from the live counters (run it with another ``--web.listen-address`` or none at all).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from prometheus_client import CollectorRegistry, generate_latest

from exporters.accesslog.config import AccessLogConfig
from exporters.accesslog.exporter import SiteLog
from exporters.accesslog.metrics import STATUS_CLASSES, AccessLogMetrics
from promreflex.follow import FollowStats, NotTextError, check_text, read_lines, rotated_siblings


class _Files:
    """What :class:`SiteLog` needs of a follower, for files read once by :func:`read_lines`."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.stats = FollowStats()

    def poll(self) -> list[str]:
        return []

    def resume_info(self) -> str:
        return "backfill of " + ", ".join(str(f) for f in self.files)

    def close(self) -> None:
        pass


def rotated_set(path: Path, pattern: str | None = None) -> list[Path]:
    """``path``'s rotated copies oldest first, then ``path`` itself when it exists."""
    return rotated_siblings(path, pattern) + ([path] if path.is_file() else [])


def backfill(config: AccessLogConfig, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
             registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Count every configured log's rotated set; print the exposition to ``out``. Returns the registry."""
    # one rotated set per configured log (a site may have several logs: each is read once)
    sets = [rotated_set(s.path, s.rotated) for s in config.logs]
    problems = []
    for source, files in zip(config.logs, sets, strict=True):
        if not files:
            problems.append(f"site {source.site}: no file at {source.path} nor rotated copies of it")
        for f in files:
            try:
                problem = check_text(f, allow_gzip=True)
            except OSError as e:
                problem = f"unreadable ({e.strerror or e})"
            if problem:
                problems.append(f"{f}: {problem}")
    if problems:  # nothing is counted unless every file can be
        raise NotTextError("backfill refused: " + "; ".join(problems))
    registry = registry if registry is not None else CollectorRegistry()
    metrics = AccessLogMetrics(route_label=config.has_routes, buckets=config.duration_buckets, registry=registry)
    last_of_site = {source.site: i for i, source in enumerate(config.logs)}
    for i, (source, files) in enumerate(zip(config.logs, sets, strict=True)):
        reader = _Files(files)
        counter = SiteLog(source, config, metrics, follower=reader)  # type: ignore[arg-type]
        for f in files:
            before = reader.stats.lines
            for batch in read_lines(f, max_line_bytes=config.max_line_bytes, stats=reader.stats):
                counter.handle(batch)
            print(f"site {source.site}: {f}: {reader.stats.lines - before} lines", file=err)
        if last_of_site[source.site] == i:  # the site's total, after its last log
            _summary(registry, source.site, err)
    out.write(generate_latest(registry).decode())
    return registry


def _summary(registry: CollectorRegistry, site: str, err: TextIO) -> None:
    get = registry.get_sample_value
    lines = get("promreflex_accesslog_lines_total", {"site": site}) or 0
    by_class: dict[str, float] = {}
    for fam in registry.collect():
        if fam.name != "promreflex_http_requests":
            continue
        for s in fam.samples:
            if s.name.endswith("_total") and s.labels.get("site") == site:
                by_class[s.labels["status_class"]] = by_class.get(s.labels["status_class"], 0) + s.value
    rejected = sum(
        s.value for fam in registry.collect() if fam.name == "promreflex_accesslog_parse_errors"
        for s in fam.samples if s.name.endswith("_total") and s.labels.get("site") == site
    )
    classes = " ".join(f"{c} {int(by_class.get(c, 0))}" for c in STATUS_CLASSES)
    print(f"site {site}: total {int(lines)} lines: {classes}, rejected {int(rejected)}", file=err)
    if lines and rejected * 2 > lines:
        print(f"site {site}: WARNING: {int(rejected)} of {int(lines)} lines rejected: is the format right? "
              "(promreflex_accesslog_parse_errors_total by reason in the output)", file=err)

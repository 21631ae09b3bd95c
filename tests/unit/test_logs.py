"""One log record, one line: a label value with a newline forged a log line of its own."""

from __future__ import annotations

import logging

from promreflex.logs import FORMAT, OneLineFormatter


def test_a_newline_in_a_quoted_value_stays_on_the_records_line():
    fmt = OneLineFormatter(FORMAT)
    site = "shop\n2026-11-28 12:00:00,000 INFO promreflex.controller: forged\r\x1b[2J"
    record = logging.LogRecord("promreflex.action.copy-guard", logging.INFO, __file__, 1, "site %s: held", (site,), None)
    out = fmt.format(record)
    assert "\n" not in out and "\r" not in out and "\x1b" not in out
    assert "site shop\\n2026-11-28 12:00:00,000 INFO promreflex.controller: forged\\r\\x1b[2J: held" in out
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed\tonce", (), sys.exc_info())
    out = fmt.format(record)
    assert out.splitlines()[0].endswith("failed\tonce") and "Traceback" in out  # a tab stays; ours keeps its lines


async def test_the_log_actions_file_is_private_as_the_audit_log(tmp_path):
    """Its records hold the alerts' labels; it was created readable by everyone (0644)."""
    import os
    import stat

    from controllers.actions.base import ActionContext
    from controllers.actions.builtin import LogAction, LogParams
    from controllers.models import Alert
    from tests.payloads import alert

    path = tmp_path / "out" / "actions.jsonl"
    old = os.umask(0o022)
    try:
        action = LogAction()
        ctx = ActionContext(route="r", alert=Alert.model_validate(alert("X", site="shop")),
                            params=LogParams(path=path))
        assert (await action.fire(ctx)).startswith("fire")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert '"site": "shop"' in path.read_text()

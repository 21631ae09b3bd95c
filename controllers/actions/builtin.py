"""The actions that ship with the controller core."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from controllers.actions.base import Action, ActionContext, register


class LogParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    message: str = "alert received"
    path: Path | None = None  # append a JSON line per transition here too


@register
class LogAction(Action):
    """Writes one line per transition: shows the loop end to end before real actions exist."""

    name = "log"
    Params = LogParams
    concurrency = 4
    resolved_means = "a second line, with transition=resolve"

    async def fire(self, ctx: ActionContext) -> str:
        return self._write(ctx, "fire")

    async def resolve(self, ctx: ActionContext) -> str:
        return self._write(ctx, "resolve")

    def _write(self, ctx: ActionContext, transition: str) -> str:
        params: LogParams = ctx.params  # type: ignore[assignment]
        record = {
            "ts": time.time(),
            "action": self.name,
            "transition": transition,
            "route": ctx.route,
            "fingerprint": ctx.alert.fingerprint,
            "startsAt": ctx.alert.startsAt.isoformat(),
            "labels": ctx.labels,
            "message": params.message,
        }
        line = json.dumps(record, sort_keys=True)
        self.log.info("%s", line)
        if params.path is not None:
            params.path.parent.mkdir(parents=True, exist_ok=True)
            # 0600 as the audit log: the records hold alert labels (hosts, users, whatever the
            # rules put there); a file that already exists keeps its mode
            fd = os.open(params.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line + "\n")
        return f"{transition}: {params.message}"

"""The copy guard's manifest: ``promreflex copy``, ``copy-guard`` and ``calibrate``, the
``copy-guard`` controller route, its rules and dashboard."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="copy_guard",
    summary="throttle (or pause) bulk copies while the shop serves fewer requests than its calibrated threshold",
    cli=(lazy("controllers.copy_guard.cli:register"), lazy("controllers.copy_guard.calibrate:register")),
    routes=(
        # While the shop serves fewer requests per second than its calibrated threshold under real
        # demand, slow every copy registered for that site (`promreflex copy`, or
        # `promreflex copy-guard adopt --pid N` for rsync/cp/tar) to the share of its speed the
        # shop affords (AIMD on the served rate, read from Prometheus; pause only in an
        # emergency), and let it run free once the shop is back above its line and the share
        # has climbed back to 1. The registry is the absolute default (registry.default_dir).
        # A crowd (CopyGuardSiteCrowded: visitors arriving faster than 1.5x the threshold, or the
        # backlog one left) pauses the copies until its queue has drained, then gives them back
        # the share they had (`crowd: pause`). Shipped since issue 16's fifth bench (README
        # "Copy guard", "Fifth bench"): the throttle without it saved 58% of the lost
        # responses on the built-in shop and held WordPress's backup past the window.
        {"name": "copy-guard",
         "matchers": ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted|CopyGuardSiteCrowded"'],
         "action": "copy-guard", "params": {"mode": "adaptive", "crowd": "pause", "max_pause": "2m"}},
    ),
    rules=("copy-guard.rules.yml",),
    host_actions=("copy-guard",),
    dashboards=("copy_guard.json",),
)

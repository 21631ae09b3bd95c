"""The copy guard's manifest: ``promreflex copy``, ``copy-guard`` and ``calibrate``, the
``copy-guard`` controller route, its rules and dashboard."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="copy_guard",
    summary="pause bulk copies while the shop serves fewer requests than its calibrated threshold",
    cli=(lazy("controllers.copy_guard.cli:register"), lazy("controllers.copy_guard.calibrate:register")),
    routes=(
        # While the shop serves fewer requests per second than its calibrated threshold under real
        # demand, pause every copy registered for that site (`promreflex copy`, or
        # `promreflex copy-guard adopt --pid N` for rsync/cp/tar), and resume when it recovers.
        {"name": "copy-guard", "matchers": ['alertname=~"CopyGuardSiteOverloaded|CopyGuardSiteOverloadPredicted"'],
         "action": "copy-guard", "params": {"registry_dir": ".promreflex/copies", "max_pause": "2m"}},
    ),
    rules=("copy-guard.rules.yml",),
    dashboards=("copy_guard.json",),
)

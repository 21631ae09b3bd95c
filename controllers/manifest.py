"""The controller's manifest: the ``controller`` and ``check-config`` subcommands. The
controller process itself is part of the foundation (``promreflex/foundation.py``), which runs
``promreflex controller`` without importing this package."""

from promreflex.capability import Capability, lazy

CAPABILITY = Capability(
    name="controller",
    summary="the Alertmanager webhook controller and its configuration check",
    cli=(lazy("controllers.cli:register"),),
    reload_checks=(lazy("controllers.cli:reload_check"),),
)

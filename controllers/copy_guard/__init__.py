"""Copy guard (seed 000): pause or throttle a backup copy while the shop it shares a disk with
suffers.

- ``threshold``: the calibrated served-RPS threshold and demand floor, published as a
  node_exporter textfile that ``rules/copy-guard.rules.yml`` reads.
- ``copier``: ``promreflex copy SRC DST``, a resumable copier with its own ``/metrics`` and a
  loopback control endpoint (pause / resume / throttle, with a lease).
- ``registry``: the directory where every running copy (own or adopted) registers itself.
- ``freeze``: pausing foreign processes (rsync, cp, tar): cgroup v2 / v1 freezer, else signals.
- ``action``: the ``copy-guard`` controller action; ``cli``: the subcommands.
"""

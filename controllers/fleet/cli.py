"""``promreflex fleet up N | status | load K | down``."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_DIR = Path(".promreflex/fleet")


def _fleet(args: argparse.Namespace):  # noqa: ANN202
    from controllers.fleet.lab import Fleet

    return Fleet(args.dir)


def cmd_up(args: argparse.Namespace) -> int:
    print(f"fleet up: {args.shops} shop host(s) in network namespaces, state in {args.dir}")
    state = _fleet(args).up(args.shops, interval=args.interval, threshold=args.threshold, floor=args.floor,
                            copy_mib=args.copy_mib, copy_rate=args.copy_rate)
    print(f"up. Overload one shop: `promreflex fleet load 1`; its copy pauses, the others' do not.\n"
          f"Prometheus: {state['prometheus'][0]}  Alertmanager: {state['alertmanager'][0]}  "
          f"stop: `promreflex fleet down`")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    print("\n".join(_fleet(args).status()))
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    answered = _fleet(args).load(args.shop, args.seconds, args.rate)
    print(f"shop{args.shop}: {answered} requests answered in {args.seconds:g} s")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    _fleet(args).down()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fleet", help="a simulated fleet of shops (network namespaces) with host agents and HA alerting")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default: %(default)s)")
    sub = p.add_subparsers(dest="fleet_command", required=True)
    up = sub.add_parser("up", help="start N shop hosts, the Prometheus pair and the Alertmanager cluster")
    up.add_argument("shops", type=int, help="number of shop hosts (1-20)")
    up.add_argument("--interval", default="1s", help="scrape and evaluation interval (default %(default)s)")
    up.add_argument("--threshold", type=float, default=50.0,
                    help="served requests/s below which a shop suffers, for every shop (default %(default)s)")
    up.add_argument("--floor", type=float, default=5.0, help="demand below which a shop is quiet (default %(default)s)")
    up.add_argument("--copy-mib", type=int, default=512, help="size of each shop's backup copy in MiB (default %(default)s)")
    up.add_argument("--copy-rate", default="4M", help="each copy's rate limit, bytes/s (default %(default)s)")
    up.set_defaults(func=cmd_up)
    sub.add_parser("status", help="the fleet's processes").set_defaults(func=cmd_status)
    ld = sub.add_parser("load", help="offer one shop more demand than its threshold says it serves")
    ld.add_argument("shop", type=int, help="shop number (1-N)")
    ld.add_argument("--seconds", type=float, default=30.0, help="how long (default %(default)s)")
    ld.add_argument("--rate", type=float, default=20.0, help="requests per second offered (default %(default)s)")
    ld.set_defaults(func=cmd_load)
    sub.add_parser("down", help="stop every process and remove every namespace the fleet made").set_defaults(func=cmd_down)

"""``python -m bench.shop up|down --dir DIR``: see :mod:`bench.shop.wordpress`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.shop.wordpress import ShopError, WordPressShop


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shop", description=__doc__)
    ap.add_argument("command", choices=["up", "down"])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/promreflex-shop"), help="the shop's private directory")
    ap.add_argument("--port", type=int, default=0, help="nginx port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--fpm-children", type=int, default=4, help="php-fpm workers (default 4)")
    ap.add_argument("--products", type=int, default=300, help="product posts at install (default 300)")
    ap.add_argument("--keep", action="store_true", help="down: keep the directory (database, WordPress) for the next up")
    a = ap.parse_args(argv)
    shop = WordPressShop(a.dir, port=a.port, fpm_children=a.fpm_children, products=a.products, keep=a.keep)
    try:
        if a.command == "up":
            shop.up()
            print(f"shop: {shop.url}/  stub_status: {shop.stub_status_url}  access log: {shop.access_log}")
            print(f"stop it with: python -m bench.shop down --dir {shop.dir}")
        else:
            print("stopped: " + (", ".join(shop.down()) or "nothing was running"))
    except ShopError as e:
        print(f"bench.shop: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

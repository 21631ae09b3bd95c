"""The real PHP shop of the copy-guard bench (bench/shop): MariaDB, php-fpm, WordPress and nginx
from Debian's packages come up in a private directory, serve a product page rendered by PHP from
the database, take a review (a committed INSERT), log every request in the format the access-log
exporter reads, and go down cleanly (every process gone, the directory removed)."""

from __future__ import annotations

import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from bench.shop.wordpress import BINARIES, WordPressShop, missing_binaries
from exporters.accesslog.parse import build_parser
from promreflex.proc import pid_alive, wait_until

pytestmark = pytest.mark.integration


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003 - stdlib signature
        return None


def _count_reviews(shop: WordPressShop) -> int:
    out = subprocess.run([BINARIES["mariadb"], "--no-defaults", f"--socket={shop.db_socket}", "-u", "root", "--batch",
                          "--skip-column-names", "-e", "SELECT COUNT(*) FROM wordpress.wp_comments"],
                         capture_output=True, text=True, timeout=30, check=True)
    return int(out.stdout.strip())


def test_wordpress_shop_serves_from_php_and_db_and_goes_down_cleanly() -> None:
    assert not missing_binaries(), f"install the shop's packages: {missing_binaries()}"
    root = Path(tempfile.mkdtemp(prefix="promreflex-wp-test-"))
    root.chmod(0o755)  # nginx workers (www-data) read the docroot
    shop = WordPressShop(root / "shop", products=20)
    pids: dict[str, int] = {}
    try:
        shop.up(progress=lambda *_: None)
        pids = shop.pids()
        assert set(pids) == {"mariadb", "php-fpm", "nginx"}
        assert len(shop.post_ids) == 20

        # A product page: PHP (our theme's markup) with the product from the database.
        post = shop.post_ids[3]
        with urllib.request.urlopen(f"{shop.url}/?p={post}", timeout=30) as resp:  # noqa: S310 - loopback
            page = resp.read().decode()
        assert resp.status == 200
        assert "Product 4:" in page and "Price: EUR" in page and 'class="reviews"' in page

        # A search scans the posts table.
        word = shop.words[0]
        with urllib.request.urlopen(f"{shop.url}/?s={word}", timeout=30) as resp:  # noqa: S310
            assert resp.status == 200

        # A review: one committed INSERT, answered with a redirect to the product.
        before = _count_reviews(shop)
        assert before == 20 * 20 + 1  # 20 per product at install (a page lists 20) + WordPress's sample comment
        body = urllib.parse.urlencode({"comment_post_ID": post, "author": "test", "email": "t@example.invalid",
                                       "comment": "integration test review", "submit": "Post Comment"}).encode()
        opener = urllib.request.build_opener(_NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as redirect:
            opener.open(urllib.request.Request(f"{shop.url}/wp-comments-post.php", data=body), timeout=30)
        assert redirect.value.code == 302
        assert "product-4-" in redirect.value.headers["Location"]  # the product's permalink, at the new review
        assert _count_reviews(shop) == before + 1
        # The bench deletes what a run posted: the next run meets the same shop.
        assert shop.reset() == 1 and _count_reviews(shop) == before

        # Every request is in the access log, in the format the access-log exporter parses.
        parser = build_parser("nginx_timed")
        lines = wait_until(lambda: [ln for ln in shop.access_log.read_text().splitlines() if "wp-comments-post" in ln],
                           timeout=10, what="the review in the access log")
        parsed = parser.parse(lines[-1])
        assert not isinstance(parsed, str), parsed
        assert parsed.status == 302 and parsed.upstream_time is not None

        with urllib.request.urlopen(shop.stub_status_url, timeout=10) as resp:  # noqa: S310
            assert b"Active connections" in resp.read()
    finally:
        stopped = shop.down()
    assert sorted(stopped) == sorted(pids)
    for name, pid in pids.items():
        assert not pid_alive(pid), f"{name} (pid {pid}) survived down()"
    assert not shop.dir.exists()
    root.rmdir()

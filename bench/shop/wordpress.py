"""A real PHP web shop from Debian's packages, set up and torn down in a private directory:
MariaDB, php-fpm, WordPress and nginx, all on loopback, no system service touched.

- MariaDB (``mariadb-server``): ``mariadb-install-db`` into ``<dir>/mysql/data``, ``mariadbd``
  with ``--no-defaults``, ``--skip-networking`` and its own socket, pid file and log. Stock
  InnoDB settings (a commit is fsync'd).
- php-fpm (``php8.2-fpm``, ``php8.2-mysql``): a private master with one static pool of
  ``fpm_children`` workers on a unix socket (``-R``: the bench runs as root; the pool's user is
  root). The system's php.ini and extension list are read, nothing is written there.
- WordPress (``wordpress``, ``/usr/share/wordpress``): Debian's ``wp-config.php`` reads
  ``/etc/wordpress/config-<host>.php``, and ``wp-load.php`` finds its config next to the real
  file, so the code is copied (``cp -rL``, about 60 MB) to ``<dir>/www`` with a ``wp-config.php``
  of ours pointing at the private database. Debian ships no theme: a small classic one of ours
  (``bench/shop/wp/theme``: product list, search, product page with reviews and the review form)
  and a must-use plugin that turns off the comment-flood check (every load-test visitor comes
  from 127.0.0.1). WP-Cron, updates and outgoing HTTP are off. Installed non-interactively by
  ``php`` (CLI) running ``bench/shop/wp/setup.php``: ``wp_install()`` and ``products`` posts.
- nginx: a private master serving ``<dir>/www`` with ``fastcgi_pass`` to the pool, its access
  log in the stack's format (:data:`promreflex.foundation.NGINX_LOG_FORMAT`, what the access-log
  exporter reads) and ``stub_status`` on a second loopback port.

What a visitor can do (the load profile, :data:`PROFILE`): read a product page ``/?p=ID``,
search ``/?s=WORD`` (a LIKE scan over every post), browse the home page, and post a review
(``POST /wp-comments-post.php``: one INSERT, committed, answered with a 302).

    python -m bench.shop up --dir /var/tmp/promreflex-shop     # prints the URLs, leaves it running
    python -m bench.shop down --dir /var/tmp/promreflex-shop   # stops it (by the PIDs it recorded)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promreflex.foundation import NGINX_LOG_FORMAT, nginx_temp_paths
from promreflex.fsutil import atomic_write_json, read_json
from promreflex.proc import Child, Timeout, free_port, http_ok, pid_alive, terminate, wait_until

HERE = Path(__file__).parent / "wp"
#: nginx's workers and php-fpm's socket: Debian's web server user (nginx's default, nobody, is
#: not in any group the socket could be shared with).
WEB_USER = "www-data"
WORDPRESS = Path("/usr/share/wordpress")
BINARIES = {"mariadbd": "/usr/sbin/mariadbd", "mariadb-install-db": "/usr/bin/mariadb-install-db",
            "mariadb": "/usr/bin/mariadb", "php-fpm": "/usr/sbin/php-fpm8.2", "php": "/usr/bin/php8.2",
            "nginx": "/usr/sbin/nginx"}
#: Debian packages the shop needs (scripts/install-system.sh installs them for the bench).
PACKAGES = ("mariadb-server", "php8.2-fpm", "php8.2-mysql", "php8.2-cli", "wordpress", "nginx")

#: The shop's visitors, as paths and weights (``{post}``: a product id, ``{word}``: a search
#: word, ``{n}``: a unique number). ``POST`` entries carry a form body.
PROFILE: list[dict[str, Any]] = [
    {"name": "product", "method": "GET", "path": "/?p={post}", "weight": 60},
    {"name": "search", "method": "GET", "path": "/?s={word}", "weight": 15},
    {"name": "home", "method": "GET", "path": "/", "weight": 15},
    {"name": "review", "method": "POST", "path": "/wp-comments-post.php", "weight": 10,
     "form": {"comment_post_ID": "{post}", "author": "shopper {n}", "email": "shopper{n}@example.invalid",
              "comment": "Review {n}: as described, would buy again.", "submit": "Post Comment"}},
]


class ShopError(RuntimeError):
    """The shop could not be set up or stopped; the message says which step and shows its log."""


def missing_binaries() -> list[str]:
    return [path for path in BINARIES.values() if not os.access(path, os.X_OK)]


@dataclass
class WordPressShop:
    """The shop in ``dir`` (created; removed by :meth:`down` unless ``keep``)."""

    dir: Path
    port: int = 0
    stub_port: int = 0
    fpm_children: int = 4
    products: int = 300
    reviews: int = 20  # per product at install: a page lists at most 20, so its cost stays flat
    seed: int = 16
    keep: bool = False
    state: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir = self.dir.resolve()
        self.port = self.port or free_port()
        self.stub_port = self.stub_port or free_port()

    # ------------------------------------------------------------------ paths and URLs
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stub_status_url(self) -> str:
        return f"http://127.0.0.1:{self.stub_port}/stub_status"

    @property
    def access_log(self) -> Path:
        return self.dir / "nginx" / "access.log"

    @property
    def www(self) -> Path:
        return self.dir / "www"

    @property
    def db_socket(self) -> Path:
        return self.dir / "mysql" / "mysqld.sock"

    @property
    def fpm_socket(self) -> Path:
        return self.dir / "php" / "fpm.sock"

    @property
    def state_file(self) -> Path:
        return self.dir / "shop.json"

    @property
    def post_ids(self) -> list[int]:
        return list(self.state.get("post_ids", []))

    @property
    def words(self) -> list[str]:
        return list(self.state.get("words", []))

    # ------------------------------------------------------------------ lifecycle
    def up(self, progress: Callable[[str], None] = print, timeout: float = 90.0) -> WordPressShop:
        """Install (first time) and start MariaDB, php-fpm and nginx; wait until a product page
        is served from PHP and the database."""
        missing = missing_binaries()
        if missing:
            raise ShopError(f"missing {', '.join(missing)}: install the Debian packages {' '.join(PACKAGES)}")
        old = read_json(self.state_file, default=None)
        if old and any(pid_alive(p) for p in old.get("pids", {}).values()):
            raise ShopError(f"a shop is already running from {self.dir}: python -m bench.shop down --dir {self.dir}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = {"port": self.port, "stub_port": self.stub_port, "pids": {}, "dir": str(self.dir)}
        t0 = time.monotonic()
        try:
            fresh = not (self.dir / "mysql" / "data" / "mysql").exists()
            if fresh:
                self._install_db()
            self._start("mariadb", [BINARIES["mariadbd"], "--no-defaults", f"--datadir={self.dir / 'mysql' / 'data'}",
                                    f"--socket={self.db_socket}", f"--pid-file={self.dir / 'mysql' / 'mariadbd.pid'}",
                                    "--skip-networking", "--user=root", f"--log-error={self.dir / 'mysql' / 'error.log'}",
                                    "--innodb-buffer-pool-size=256M", "--max-connections=200"],
                        ready=self.db_socket.exists, timeout=timeout)
            password = self._db_password()
            if fresh:
                self._sql(f"CREATE DATABASE IF NOT EXISTS wordpress; CREATE USER IF NOT EXISTS 'wordpress'@'localhost' "
                          f"IDENTIFIED BY '{password}'; GRANT ALL ON wordpress.* TO 'wordpress'@'localhost';")
            self._write_www(password)
            self._write_fpm()
            self._start("php-fpm", [BINARIES["php-fpm"], "--nodaemonize", "-R", "--fpm-config", str(self.dir / "php" / "fpm.conf")],
                        ready=self.fpm_socket.exists, timeout=timeout)
            self._write_nginx()
            self._start("nginx", [BINARIES["nginx"], "-c", str(self.dir / "nginx" / "nginx.conf"), "-p", str(self.dir / "nginx"),
                                  "-g", "daemon off;"], ready=lambda: http_ok(self.stub_status_url), timeout=timeout)
            if fresh or not (self.dir / "seed.json").exists():
                self._seed(progress)
            self.state.update(read_json(self.dir / "seed.json", default={}) or {})
            atomic_write_json(self.state_file, self.state)
            first = self.post_ids[0]
            try:
                wait_until(lambda: self.page_ok(f"/?p={first}"), timeout=timeout, interval=0.5,
                           what=f"a product page from {self.url}")
            except Timeout as e:
                raise ShopError(f"{e}\n--- {self.access_log}:\n{_tail(self.access_log, 5)}\n--- nginx error.log:\n"
                                f"{_tail(self.dir / 'nginx' / 'error.log', 5)}") from e
        except BaseException:
            self.down(remove=False)
            raise
        progress(f"  wordpress shop    ready in {time.monotonic() - t0:4.1f}s  {self.url}/ ({len(self.post_ids)} products, "
                 f"{self.fpm_children} php-fpm workers; access log {self.access_log})")
        return self

    def down(self, remove: bool | None = None) -> list[str]:
        """Stop nginx, php-fpm and MariaDB (reverse order, by recorded PID); remove the
        directory unless ``keep`` (or ``remove=False``). Returns what was stopped."""
        recorded = (read_json(self.state_file, default=None) or {}).get("pids", {})
        pids = {**recorded, **self.state.get("pids", {})}
        stopped = []
        for name in ("nginx", "php-fpm", "mariadb"):
            pid = pids.get(name)
            if pid and pid_alive(pid) and _runs(pid, BINARIES["mariadbd" if name == "mariadb" else name]):
                if not terminate(pid, grace=30):
                    raise ShopError(f"could not stop {name} (pid {pid})")
                stopped.append(name)
        if self.state_file.exists():
            atomic_write_json(self.state_file, {**(read_json(self.state_file, default={}) or {}), "pids": {}})
        if remove if remove is not None else not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        return stopped

    def reset(self) -> int:
        """Delete the reviews posted since the install (and their meta), recount the products'
        reviews: the next run meets the same shop. Returns how many were deleted."""
        top = int(self.state.get("max_comment_id", 0))
        out = self._sql(f"SELECT COUNT(*) FROM wordpress.wp_comments WHERE comment_ID > {top};"
                        f"DELETE FROM wordpress.wp_commentmeta WHERE comment_id > {top};"
                        f"DELETE FROM wordpress.wp_comments WHERE comment_ID > {top};"
                        "UPDATE wordpress.wp_posts p SET comment_count = (SELECT COUNT(*) FROM wordpress.wp_comments c "
                        "WHERE c.comment_post_ID = p.ID AND c.comment_approved = '1');")
        return int(out.split()[-1])

    def pids(self) -> dict[str, int]:
        return dict(self.state.get("pids", {}))

    def page_ok(self, path: str) -> bool:
        """True when ``path`` answers 200 with a page WordPress rendered (our theme's markup)."""
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:  # noqa: S310 - loopback
                return resp.status == 200 and b'class="reviews"' in resp.read()
        except OSError:
            return False

    # ------------------------------------------------------------------ steps
    def _start(self, name: str, argv: list[str], ready: Callable[[], bool], timeout: float) -> None:
        child = Child(name, argv, self.dir / "logs" / f"{name}.log").start()
        self.state["pids"][name] = child.pid
        atomic_write_json(self.state_file, self.state)
        try:
            wait_until(lambda: (not child.alive()) or ready(), timeout=timeout, interval=0.1, what=f"{name} ready")
        except Exception as e:
            raise ShopError(f"{name} did not become ready: {e}\n--- {child.log_path}:\n{child.tail()}") from e
        if not child.alive():
            raise ShopError(f"{name} exited at start\n--- {child.log_path}:\n{child.tail()}"
                            + (f"\n--- error.log:\n{_tail(self.dir / 'mysql' / 'error.log')}" if name == "mariadb" else ""))

    def _run(self, what: str, argv: list[str], stdin: str | None = None, timeout: float = 120) -> str:
        res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
        if res.returncode != 0:
            raise ShopError(f"{what} failed (exit {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        return res.stdout

    def _install_db(self) -> None:
        data = self.dir / "mysql" / "data"
        data.mkdir(parents=True, exist_ok=True)
        self._run("mariadb-install-db", [BINARIES["mariadb-install-db"], "--no-defaults", f"--datadir={data}", "--user=root",
                                         "--skip-test-db", "--auth-root-authentication-method=socket"])

    def _sql(self, statements: str) -> str:
        return self._run("mariadb", [BINARIES["mariadb"], "--no-defaults", f"--socket={self.db_socket}", "-u", "root",
                                     "--batch"], stdin=statements)

    def _db_password(self) -> str:
        path = self.dir / "mysql" / "wordpress.password"
        if not path.exists():
            path.write_text(secrets.token_hex(16))
            path.chmod(0o600)
        return path.read_text().strip()

    def _write_www(self, password: str) -> None:
        if not (self.www / "wp-load.php").exists():
            self.www.parent.mkdir(parents=True, exist_ok=True)
            self._run("copy WordPress", ["cp", "-rL", str(WORDPRESS), str(self.www)])
        theme = self.www / "wp-content" / "themes" / "promreflex-shop"
        shutil.copytree(HERE / "theme", theme, dirs_exist_ok=True)
        (self.www / "wp-content" / "mu-plugins").mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "mu-plugin.php", self.www / "wp-content" / "mu-plugins" / "promreflex-shop.php")
        salts = "\n".join(f"define('{k}', '{secrets.token_hex(32)}');" for k in (
            "AUTH_KEY", "SECURE_AUTH_KEY", "LOGGED_IN_KEY", "NONCE_KEY", "AUTH_SALT", "SECURE_AUTH_SALT",
            "LOGGED_IN_SALT", "NONCE_SALT"))
        (self.www / "wp-config.php").write_text(f"""<?php
// Written by bench/shop/wordpress.py: the private database of this shop, nothing from /etc/wordpress.
define('DB_NAME', 'wordpress');
define('DB_USER', 'wordpress');
define('DB_PASSWORD', '{password}');
define('DB_HOST', 'localhost:{self.db_socket}');
define('DB_CHARSET', 'utf8mb4');
define('DB_COLLATE', '');
define('WP_HOME', '{self.url}');
define('WP_SITEURL', '{self.url}');
define('DISABLE_WP_CRON', true);          // no loopback requests of its own in the access log
define('AUTOMATIC_UPDATER_DISABLED', true);
define('WP_HTTP_BLOCK_EXTERNAL', true);   // loopback only: no update checks, no pingbacks out
define('WP_DEBUG', false);
{salts}
$table_prefix = 'wp_';
if (!defined('ABSPATH')) {{ define('ABSPATH', __DIR__ . '/'); }}
require_once ABSPATH . 'wp-settings.php';
""")

    def _write_fpm(self) -> None:
        d = self.dir / "php"
        d.mkdir(parents=True, exist_ok=True)
        (d / "fpm.conf").write_text(f"""; Written by bench/shop/wordpress.py
[global]
pid = {d / 'fpm.pid'}
error_log = {d / 'fpm-error.log'}
daemonize = no

[shop]
user = root
group = root
listen = {self.fpm_socket}
listen.owner = {WEB_USER}
listen.group = {WEB_USER}
listen.mode = 0660
pm = static
pm.max_children = {self.fpm_children}
pm.max_requests = 0
catch_workers_output = yes
php_admin_value[error_log] = {d / 'php-error.log'}
php_admin_flag[log_errors] = on
""")

    def _write_nginx(self) -> None:
        d = self.dir / "nginx"
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        (d / "nginx.conf").write_text(f"""# Written by bench/shop/wordpress.py: the shop's own nginx (loopback only).
user {WEB_USER};
worker_processes 1;
pid {d / 'nginx.pid'};
error_log {d / 'error.log'} warn;
events {{ worker_connections 1024; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    log_format promreflex '{NGINX_LOG_FORMAT}';
    access_log {self.access_log} promreflex;
{nginx_temp_paths(str(d / 'tmp'))}
    keepalive_timeout 65;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.www};
        index index.php;
        location / {{ try_files $uri $uri/ /index.php?$args; }}
        location ~ \\.php$ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_pass unix:{self.fpm_socket};
            fastcgi_read_timeout 60s;
        }}
    }}
    server {{
        listen 127.0.0.1:{self.stub_port};
        access_log off;
        location = /stub_status {{ stub_status; }}
    }}
}}
""")

    def _seed(self, progress: Callable[[str], None]) -> None:
        t = time.monotonic()
        out = self._run("WordPress install", [BINARIES["php"], str(HERE / "setup.php"), str(self.www), self.url,
                                              str(self.products), str(self.seed), str(self.reviews)], timeout=600)
        seed = json.loads(out.strip().splitlines()[-1])
        atomic_write_json(self.dir / "seed.json", seed)
        progress(f"  installed WordPress with {len(seed['post_ids'])} products in {time.monotonic() - t:.1f}s")


def _runs(pid: int, binary: str) -> bool:
    """PID-reuse guard: the process still runs ``binary`` (nginx and php-fpm rewrite their
    titles to ``nginx: master process ...``, ``php-fpm: master process ...``)."""
    import psutil

    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    name = Path(binary).name
    return binary in cmd or cmd.startswith(name.split("8")[0].rstrip("-") + ":")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""

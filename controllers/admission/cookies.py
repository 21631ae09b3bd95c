"""Signed session cookies: HMAC-SHA256 with key rotation.

A cookie is ``v1.<kid>.<sid>.<issued>.<expires>.<mac>``: ``kid`` names the key that signed it
(the first 8 hex digits of the key's SHA-256), ``sid`` is 16 random bytes (URL-safe base64),
``issued``/``expires`` are Unix seconds and ``mac`` is HMAC-SHA256 over everything before it
(URL-safe base64, no padding). Several keys may be loaded: the newest (the last line of the key
file) signs, every one verifies, so a key is rotated by appending a new line and removing the old
one after ``session.max_age``.

What a signature cannot stop is a cookie copied while valid (replay). The proxy therefore trusts a
cookie only for a session it tracks (:class:`~controllers.admission.sched.Sessions`): a session
ends at a logout page or an idle timeout, and its cookie is refused from then on (it waits in the
session queue like a new visitor); a shared cookie gains at most ``session.max_in_flight``
requests at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from promreflex.errors import UserError

MIN_KEY_CHARS = 32
MAX_COOKIE_CHARS = 200
REASONS = ("malformed", "unknown_key", "bad_signature", "expired", "ended")


class CookieError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def key_id(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()[:8]


@dataclass(frozen=True)
class KeyRing:
    """The signing keys, oldest first; the last one signs."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def ephemeral(cls) -> KeyRing:
        secret = secrets.token_bytes(32)
        return cls(((key_id(secret), secret),))

    @classmethod
    def parse(cls, text: str, source: str = "key file") -> KeyRing:
        keys: list[tuple[str, bytes]] = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if len(line) < MIN_KEY_CHARS or any(c.isspace() for c in line) or not line.isprintable():
                raise UserError(f"{source} line {n}: a key is one word of at least {MIN_KEY_CHARS} printable "
                                "characters (promreflex admission keygen writes one)")
            secret = line.encode()
            keys.append((key_id(secret), secret))
        if not keys:
            raise UserError(f"{source} holds no key: run `promreflex admission keygen --key-file {source}`")
        return cls(tuple(keys))

    @classmethod
    def from_file(cls, path: Path) -> KeyRing:
        """Read ``path``; refused (one line) when group or others may read it, like ssh keys."""
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise UserError(f"key file {path} is not a regular file ({stat.filemode(st.st_mode)}): give the "
                                "file `promreflex admission keygen --key-file` wrote")
            if st.st_mode & 0o077:
                raise UserError(f"key file {path} is accessible by group or others "
                                f"(mode {stat.filemode(st.st_mode)}): run chmod 600 {path}")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"key file {path} does not exist: run `promreflex admission keygen --key-file {path}`"
                            ) from None
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read key file {path}: {getattr(e, 'strerror', None) or e}") from None
        return cls.parse(text, str(path))

    @property
    def signing(self) -> tuple[str, bytes]:
        return self.keys[-1]

    def get(self, kid: str) -> bytes | None:
        for k, secret in self.keys:
            if k == kid:
                return secret
        return None


def append_key(path: Path) -> str:
    """Append a fresh key to ``path`` (created with mode 0600); returns its id. Rotation: run it,
    restart (or SIGHUP) the proxy, and drop the oldest line after ``session.max_age``."""
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)
    return key_id(secret.encode())


@dataclass(frozen=True)
class Ticket:
    sid: str
    issued: int
    expires: int


#: Verified cookies remembered (their value -> ticket); past it the memory starts over.
VERIFIED_CACHE = 32_768


class CookieCodec:
    """Signs and verifies cookies with one key ring.

    A session sends the same cookie with every request, and the proxy never re-signs it (a
    cookie is issued once, at admission), so a value that verified once is remembered with its
    ticket: the next request pays a dictionary look-up and the expiry check, not an HMAC. Only
    a value that verified under this codec's ring is remembered, so a forged one is checked
    every time, and a new ring (key rotation, SIGHUP) comes with a new codec and an empty
    memory. The memory is bounded (:data:`VERIFIED_CACHE` values of at most
    :data:`MAX_COOKIE_CHARS`)."""

    def __init__(self, ring: KeyRing, cache_size: int = VERIFIED_CACHE):
        self.ring = ring
        self.cache_size = cache_size
        self._verified: dict[str, Ticket] = {}

    @staticmethod
    def new_sid() -> str:
        return _b64(secrets.token_bytes(16))

    def issue(self, sid: str, now: float, max_age: float) -> str:
        kid, secret = self.ring.signing
        body = f"v1.{kid}.{sid}.{int(now)}.{int(now + max_age)}"
        return f"{body}.{_b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())}"

    def verify(self, value: str, now: float) -> Ticket:
        """The ticket in ``value``; :class:`CookieError` (with a reason from :data:`REASONS`)."""
        ticket = self._verified.get(value)
        if ticket is not None:
            if ticket.expires <= now:
                del self._verified[value]
                raise CookieError("expired")
            return ticket
        ticket = self._verify(value, now)
        if len(self._verified) >= self.cache_size:
            self._verified.clear()
        self._verified[value] = ticket
        return ticket

    def _verify(self, value: str, now: float) -> Ticket:
        if len(value) > MAX_COOKIE_CHARS or not value.isascii():
            raise CookieError("malformed")
        parts = value.split(".")
        if len(parts) != 6 or parts[0] != "v1" or not parts[3].isdigit() or not parts[4].isdigit() or len(parts[2]) != 22:
            raise CookieError("malformed")
        secret = self.ring.get(parts[1])
        if secret is None:
            raise CookieError("unknown_key")
        body = value[: value.rfind(".")]
        expected = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, parts[5]):
            raise CookieError("bad_signature")
        ticket = Ticket(parts[2], int(parts[3]), int(parts[4]))
        if ticket.expires <= now:
            raise CookieError("expired")
        return ticket

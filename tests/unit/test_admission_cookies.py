"""Signed session cookies: what verifies, what is refused and why, key rotation, the key file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controllers.admission.cookies import CookieCodec, CookieError, KeyRing, append_key
from promreflex.errors import UserError

NOW = 1_800_000_000.0


def test_issue_and_verify_roundtrip():
    codec = CookieCodec(KeyRing.ephemeral())
    sid = codec.new_sid()
    ticket = codec.verify(codec.issue(sid, NOW, 3600), NOW + 10)
    assert (ticket.sid, ticket.issued, ticket.expires) == (sid, int(NOW), int(NOW + 3600))


@pytest.mark.parametrize("mutate, reason", [
    (lambda v: "", "malformed"),
    (lambda v: "v1.abc", "malformed"),
    (lambda v: v.replace("v1.", "v2.", 1), "malformed"),
    (lambda v: v + "x" * 300, "malformed"),
    (lambda v: v[:-1] + ("A" if v[-1] != "A" else "B"), "bad_signature"),
    # Pushing the expiry out breaks the signature.
    (lambda v: ".".join(p if i != 4 else str(int(p) + 10**6) for i, p in enumerate(v.split("."))), "bad_signature"),
    (lambda v: ".".join(p if i != 1 else "deadbeef" for i, p in enumerate(v.split("."))), "unknown_key"),
    (lambda v: v.replace(".", "\u00e9", 1), "malformed"),
])
def test_tampered_cookies_are_refused_with_a_reason(mutate, reason):
    codec = CookieCodec(KeyRing.ephemeral())
    value = codec.issue(codec.new_sid(), NOW, 3600)
    with pytest.raises(CookieError) as err:
        codec.verify(mutate(value), NOW)
    assert err.value.reason == reason


def test_expired_cookie_is_refused():
    codec = CookieCodec(KeyRing.ephemeral())
    value = codec.issue(codec.new_sid(), NOW, 60)
    codec.verify(value, NOW + 59)
    with pytest.raises(CookieError, match="expired"):
        codec.verify(value, NOW + 60)


def test_rotation_newest_signs_all_verify(tmp_path: Path):
    keys = tmp_path / "keys"
    old_id = append_key(keys)
    old = CookieCodec(KeyRing.from_file(keys))
    old_cookie = old.issue(old.new_sid(), NOW, 3600)
    new_id = append_key(keys)
    ring = KeyRing.from_file(keys)
    assert [k for k, _ in ring.keys] == [old_id, new_id] and ring.signing[0] == new_id
    codec = CookieCodec(ring)
    codec.verify(old_cookie, NOW)  # issued before the rotation: still good
    assert codec.issue(codec.new_sid(), NOW, 3600).split(".")[1] == new_id
    # The old key removed (after max_age): its cookies are refused.
    keys.write_text(keys.read_text().splitlines()[1] + "\n")
    with pytest.raises(CookieError, match="unknown_key"):
        CookieCodec(KeyRing.from_file(keys)).verify(old_cookie, NOW)


def test_key_file_must_be_private_and_hold_real_keys(tmp_path: Path):
    keys = tmp_path / "keys"
    append_key(keys)
    assert os.stat(keys).st_mode & 0o777 == 0o600
    os.chmod(keys, 0o640)
    with pytest.raises(UserError, match="chmod 600"):
        KeyRing.from_file(keys)
    os.chmod(keys, 0o600)
    keys.write_text("short\n")
    with pytest.raises(UserError, match="line 1"):
        KeyRing.from_file(keys)
    keys.write_text("# only a comment\n")
    with pytest.raises(UserError, match="holds no key"):
        KeyRing.from_file(keys)
    with pytest.raises(UserError, match="does not exist"):
        KeyRing.from_file(tmp_path / "missing")
    with pytest.raises(UserError, match="not a regular file"):  # (was "accessible by group or others")
        KeyRing.from_file(tmp_path)


def test_a_verified_cookie_is_remembered_but_still_expires():
    codec = CookieCodec(KeyRing.ephemeral(), cache_size=2)
    value = codec.issue(codec.new_sid(), NOW, 60)
    first = codec.verify(value, NOW)
    calls = []
    real = codec._verify
    codec._verify = lambda v, now: calls.append(v) or real(v, now)  # type: ignore[method-assign]
    assert codec.verify(value, NOW + 1) == first and calls == []  # no second HMAC
    with pytest.raises(CookieError) as err:
        codec.verify(value, NOW + 60)
    assert err.value.reason == "expired"
    with pytest.raises(CookieError):  # and stays refused (re-verified, still expired)
        codec.verify(value, NOW + 61)
    assert calls == [value]


def test_only_verified_cookies_are_remembered_and_the_memory_is_bounded():
    codec = CookieCodec(KeyRing.ephemeral(), cache_size=2)
    good = codec.issue(codec.new_sid(), NOW, 3600)
    forged = good[:-1] + ("A" if good[-1] != "A" else "B")
    for _ in range(2):  # refused every time, never remembered
        with pytest.raises(CookieError, match="bad_signature"):
            codec.verify(forged, NOW)
    assert forged not in codec._verified
    for _ in range(5):
        codec.verify(codec.issue(codec.new_sid(), NOW, 3600), NOW)
        assert len(codec._verified) <= 2


def test_a_new_ring_forgets_what_the_old_one_verified(tmp_path: Path):
    keys = tmp_path / "keys"
    append_key(keys)
    old = CookieCodec(KeyRing.from_file(keys))
    value = old.issue(old.new_sid(), NOW, 3600)
    old.verify(value, NOW)
    keys.write_text("")  # the old key removed, a new one added: the reload builds a new codec
    append_key(keys)
    with pytest.raises(CookieError, match="unknown_key"):
        CookieCodec(KeyRing.from_file(keys)).verify(value, NOW)

"""The resumable copier: identical trees, resume after a kill at any chunk, no half-written file
under its real name, pause/lease/throttle on a fake clock, metrics."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controllers.copy_guard.copier import (
    Control,
    CopyCollector,
    Copier,
    CopyError,
    Stopped,
    journal_path,
    part_path,
)

CHUNK = 4096


def make_tree(root: Path, seed: int = 1) -> Path:
    rnd = random.Random(seed)
    root.mkdir(parents=True)
    (root / "empty-dir").mkdir()
    (root / "a" / "b").mkdir(parents=True)
    sizes = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 17, 20 * CHUNK]
    for i, size in enumerate(sizes):
        d = root if i % 3 == 0 else root / "a" if i % 3 == 1 else root / "a" / "b"
        p = d / f"f{i}.bin"
        p.write_bytes(rnd.randbytes(size))
        os.chmod(p, 0o640 if i % 2 else 0o600)
        os.utime(p, ns=(1_600_000_000_000_000_000 + i, 1_600_000_000_000_000_000 + i))
    (root / "a" / "link").symlink_to("b/f2.bin")
    (root / "dangling").symlink_to("nowhere")
    return root


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            s = p.lstat()
            if stat.S_ISLNK(s.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(s.st_mode):
                out[rel] = ("dir", stat.S_IMODE(s.st_mode))
            else:
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(s.st_mode), s.st_mtime_ns)
    return out


def test_copies_a_tree_identically_and_cleans_up(tmp_path):
    src = make_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    progress = Copier(src, dst, chunk_size=CHUNK, checkpoint_bytes=CHUNK).run()
    assert snapshot(dst) == snapshot(src)
    assert progress.state == "done"
    assert progress.done_bytes == progress.total_bytes == sum(p.stat().st_size for p in src.rglob("*.bin"))
    assert progress.done_files == progress.total_files == 7
    assert not journal_path(dst).exists()


@pytest.mark.parametrize("io", ["fadvise", "direct", "buffered"])
def test_single_file_into_a_directory_every_io_mode(tmp_path, io):
    src = tmp_path / "big.bin"
    src.write_bytes(random.Random(3).randbytes(7 * CHUNK + 5))
    (tmp_path / "into").mkdir()
    copier = Copier(src, tmp_path / "into", chunk_size=2 * CHUNK, io=io)
    copier.run()
    assert (tmp_path / "into" / "big.bin").read_bytes() == src.read_bytes()
    assert copier.io_effective in (io, "fadvise")  # direct falls back where O_DIRECT is refused


class Crash(BaseException):
    """Stands in for SIGKILL: nothing after it runs (no checkpoint, no cleanup)."""


@pytest.mark.parametrize("seed", range(6))
def test_killed_at_random_chunks_resumes_to_an_identical_tree(tmp_path, seed):
    rnd = random.Random(seed)
    src = make_tree(tmp_path / "src", seed)
    dst = tmp_path / "dst"
    expected = snapshot(src)
    runs = 0
    while True:
        runs += 1
        assert runs < 50, "the copy never finished"
        left = rnd.randint(1, 12)

        def maybe_crash(c: Copier, left=[left]) -> None:  # noqa: B006 - a counter per run
            left[0] -= 1
            if left[0] == 0:
                # Bytes written after the last checkpoint, and even garbage, must not matter.
                part = part_path(c.final_path(c.plan.files[c.next_index]))
                with open(part, "ab") as f:
                    f.write(b"garbage after the checkpoint")
                raise Crash()

        copier = Copier(src, dst, chunk_size=CHUNK, checkpoint_bytes=CHUNK * rnd.randint(1, 3), on_chunk=maybe_crash)
        try:
            copier.run()
            break
        except Crash:
            # Whatever is under its final name is complete and identical.
            for rel, want in expected.items():
                p = dst / rel
                if want[0] == "file" and p.exists():
                    assert p.read_bytes() == want[1], rel
    assert runs > 1
    assert snapshot(dst) == expected
    assert not list(dst.rglob("*.promreflex-part"))


def test_stop_checkpoints_and_the_next_run_continues_where_it_stopped(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(10 * CHUNK))
    control = Control()

    def stop_after_three(c: Copier) -> None:
        if c.offset >= 3 * CHUNK:
            control.stop()

    first = Copier(src, tmp_path / "out.bin", chunk_size=CHUNK, checkpoint_bytes=8 * CHUNK, control=control,
                   on_chunk=stop_after_three)
    with pytest.raises(Stopped):
        first.run()
    assert not (tmp_path / "out.bin").exists()
    second = Copier(src, tmp_path / "out.bin", chunk_size=CHUNK)
    assert second.progress.resumed_from == 3 * CHUNK
    second.run()
    assert second.progress.copied_bytes == 7 * CHUNK
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()


def test_a_source_file_changed_during_the_copy_is_copied_again(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"a" * 4 * CHUNK)
    changed = []

    def change_once(c: Copier) -> None:
        if not changed:
            changed.append(1)
            src.write_bytes(b"b" * 5 * CHUNK)

    copier = Copier(src, tmp_path / "out.bin", chunk_size=CHUNK, on_chunk=change_once)
    copier.run()
    assert (tmp_path / "out.bin").read_bytes() == b"b" * 5 * CHUNK
    assert copier.progress.source_changes == 1


def test_refuses_a_destination_inside_the_source_and_a_missing_source(tmp_path):
    src = make_tree(tmp_path / "src")
    with pytest.raises(CopyError, match="inside"):
        Copier(src, src / "a" / "copy")
    with pytest.raises(CopyError, match="cannot read"):
        Copier(tmp_path / "nope", tmp_path / "x")
    with pytest.raises(ValueError):
        Copier(src, tmp_path / "x", chunk_size=1000)


# ---------------------------------------------------------------------- control on a fake clock
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_control(**kw) -> tuple[Control, FakeClock]:
    clock = FakeClock()
    control = Control(clock=clock, **kw)

    def wait(timeout=None):  # waiting = time passing
        clock.now += timeout or 0.0
        return False

    control.cond.wait = wait  # type: ignore[method-assign]
    return control, clock


def test_a_pause_holds_until_its_lease_runs_out_and_is_counted():
    control, clock = fake_control()
    control.pause(lease=5)
    assert control.snapshot()["mode"] == "paused"
    control.wait_turn(CHUNK)  # blocks (on the fake clock) until the lease expires
    snap = control.snapshot()
    assert snap["mode"] == "running"
    assert snap["lease_expiries"] == 1 and snap["pauses"] == 1
    assert snap["paused_seconds"] == pytest.approx(5.0, abs=0.3)


def test_renewing_a_pause_extends_it_and_resume_ends_it():
    control, clock = fake_control()
    control.pause(lease=5)
    clock.now += 4
    control.pause(lease=5)  # renewal: not a second pause
    clock.now += 4
    assert control.snapshot()["mode"] == "paused"
    control.resume()
    snap = control.snapshot()
    assert (snap["mode"], snap["pauses"], snap["lease_expiries"]) == ("running", 1, 0)
    assert snap["paused_seconds"] == pytest.approx(8.0)


@pytest.mark.parametrize("lease", [0, -1, 601])
def test_a_lease_out_of_bounds_is_refused(lease):
    control, _ = fake_control()
    with pytest.raises(ValueError):
        control.pause(lease=lease)
    assert control.snapshot()["mode"] == "running"


@pytest.mark.parametrize("base, throttle, want", [(0, 1e6, 1e6), (4e6, 1e6, 1e6), (5e5, 1e6, 5e5), (2e6, None, 2e6)])
def test_the_rate_cap_paces_chunks(base, throttle, want):
    control, clock = fake_control(rate_limit=base)
    if throttle:
        control.throttle(throttle, lease=600)
    start = clock.now
    for _ in range(100):
        control.wait_turn(100_000)
    # 100 chunks of 100 kB at `want` bytes/s; the first goes at once, with at most 100 ms of
    # credit saved up (a burst never exceeds the rate by more than 100 ms worth).
    assert 99 * 100_000 / want - 0.1 - 1e-6 <= clock.now - start <= 99 * 100_000 / want + 1e-6
    assert control.snapshot()["rate"] == want


def test_a_throttle_lease_expires_back_to_the_base_rate():
    control, clock = fake_control(rate_limit=0)
    control.throttle(1000, lease=2)
    clock.now += 3
    snap = control.snapshot()
    assert (snap["mode"], snap["rate"], snap["lease_expiries"]) == ("running", 0, 1)
    assert snap["throttled_seconds"] == pytest.approx(2, abs=1) and snap["pauses"] == 0


@pytest.mark.parametrize("share", [1.0, 0.5, 0.25, 0.1])
def test_a_share_runs_the_copy_that_share_of_the_time(share):
    """Each chunk's I/O takes 40 ms here (the clock moves between calls); a share s waits
    40 ms * (1 - s) / s before the next one, whatever the chunk's size or the disk's speed."""
    control, clock = fake_control()
    control.throttle(share=share, lease=600)
    start = clock.now
    for _ in range(50):
        control.wait_turn(CHUNK)
        clock.now += 0.04  # the chunk's read and write
    elapsed = clock.now - start
    assert 50 * 0.04 / elapsed == pytest.approx(share, rel=0.03)
    snap = control.snapshot()
    assert snap["share"] == share
    if share < 1:
        assert snap["share_wait_seconds"] / (snap["share_wait_seconds"] + snap["work_seconds"]) == \
            pytest.approx(1 - share, rel=0.03)


def test_a_share_counts_a_rate_caps_wait_as_the_copys_own_time():
    """Under its own --rate-limit the copy's speed is the capped one: a share of 0.5 halves it."""
    control, clock = fake_control(rate_limit=CHUNK / 0.1)  # 100 ms per chunk
    control.throttle(share=0.5, lease=600)
    start = clock.now
    for _ in range(40):
        control.wait_turn(CHUNK)
    assert (clock.now - start) / 39 == pytest.approx(0.2, rel=0.05)


def test_a_new_share_or_a_resume_applies_during_the_wait():
    control, clock = fake_control()
    control.throttle(share=0.01, lease=600)
    control.wait_turn(CHUNK)
    clock.now += 1.0  # a 1 s chunk: at 0.01 the next would wait 99 s
    waits = []
    original = control.cond.wait

    def wait(timeout=None):
        waits.append(timeout)
        if len(waits) == 3:
            control.resume()
        return original(timeout)

    control.cond.wait = wait  # type: ignore[method-assign]
    before = clock.now
    control.wait_turn(CHUNK)
    assert clock.now - before < 1.0 and control.snapshot()["share"] == 1.0


@pytest.mark.parametrize("kw", [{}, {"share": 0.5, "bytes_per_second": 10}, {"share": 0}, {"share": 1.5},
                                {"share": float("nan")}, {"bytes_per_second": float("inf")}])
def test_a_throttle_takes_exactly_one_valid_limit(kw):
    control, _ = fake_control()
    with pytest.raises(ValueError):
        control.throttle(lease=10, **kw)
    assert control.snapshot()["mode"] == "running"


def test_stop_interrupts_a_pause():
    control, _ = fake_control()
    control.pause(lease=60)
    control.stop()
    with pytest.raises(Stopped):
        control.wait_turn(1)


def test_metrics_report_progress_state_and_pauses(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(3 * CHUNK))
    control, clock = fake_control()
    copier = Copier(src, tmp_path / "o.bin", chunk_size=CHUNK, control=control)
    reg = CollectorRegistry()
    requests = {("pause", "ok"): 1}
    reg.register(CopyCollector(lambda: copier, control, "shop", "copy-1", requests))
    v = lambda name, **labels: reg.get_sample_value(name, {"site": "shop", **labels})  # noqa: E731
    assert v("promreflex_copy_size_bytes") == 3 * CHUNK and v("promreflex_copy_done_bytes") == 0
    control.pause(lease=10)
    clock.now += 2
    assert v("promreflex_copy_state", state="paused") == 1 and v("promreflex_copy_state", state="running") == 0
    assert v("promreflex_copy_paused_seconds_total") == pytest.approx(2)
    assert v("promreflex_copy_control_requests_total", command="pause", result="ok") == 1
    control.resume()
    copier.run()
    assert v("promreflex_copy_state", state="done") == 1
    assert v("promreflex_copy_done_bytes") == 3 * CHUNK == v("promreflex_copy_copied_bytes_total")
    assert v("promreflex_copy_pauses_total") == 1
    control.throttle(share=0.3, lease=10)
    assert v("promreflex_copy_throttle_share") == 0.3
    control.pause(lease=10)
    assert v("promreflex_copy_throttle_share") == 0
    assert reg.get_sample_value("promreflex_copy_info", {"site": "shop", "id": "copy-1", "io": copier.io_effective}) == 1

"""The calibrated threshold textfile: what calibrate writes and the rules read."""

from __future__ import annotations

import math
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controllers.copy_guard.threshold import FILENAME, read_thresholds, remove_threshold, write_threshold


def samples(path):
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        assert fam.type == "gauge"
        for s in fam.samples:
            out[(s.name, s.labels["site"])] = s.value
    return out


def test_write_publishes_threshold_floor_and_timestamp(tmp_path):
    path = write_threshold(tmp_path, "shop", 20.2, when=1_700_000_000.0)
    assert path == tmp_path / FILENAME
    assert samples(path) == {
        ("promreflex_copy_guard_rps_threshold", "shop"): 20.2,
        ("promreflex_copy_guard_demand_floor_rps", "shop"): 20.2,  # default: the threshold itself
        ("promreflex_copy_guard_calibration_timestamp_seconds", "shop"): 1_700_000_000.0,
    }
    assert os.stat(path).st_mode & 0o777 == 0o644  # node_exporter may run as another user


def test_other_sites_are_kept_and_a_site_is_replaced(tmp_path):
    write_threshold(tmp_path, "shop", 20.0, when=1.0)
    write_threshold(tmp_path, "blog", 5.0, when=2.0, demand_floor_rps=1.0)
    write_threshold(tmp_path, "shop", 30.0, when=3.0)
    got = read_thresholds(tmp_path)
    assert {s: (t.rps, t.demand_floor_rps, t.when) for s, t in got.items()} == {
        "shop": (30.0, 30.0, 3.0), "blog": (5.0, 1.0, 2.0)}
    assert not [p for p in tmp_path.iterdir() if p.name != FILENAME]  # no temporary file left


def test_response_time_is_published_and_read_back_and_a_bad_one_refused(tmp_path):
    path = write_threshold(tmp_path, "shop", 40.0, when=1.0, response_s=0.05)
    assert samples(path)[("promreflex_copy_guard_response_time_seconds", "shop")] == 0.05
    assert read_thresholds(tmp_path)["shop"].response_s == 0.05
    write_threshold(tmp_path, "blog", 5.0, when=1.0)  # another site without one: the shop's is kept
    assert read_thresholds(tmp_path)["blog"].response_s is None
    assert read_thresholds(tmp_path)["shop"].response_s == 0.05
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="response time"):
            write_threshold(tmp_path, "shop", 40.0, response_s=bad)


@pytest.mark.parametrize("site, rps", [("../etc", 1.0), ('a"b', 1.0), ("", 1.0), ("shop", -1.0),
                                       ("shop", math.nan), ("shop", math.inf)])
def test_bad_input_is_refused_and_the_file_untouched(tmp_path, site, rps):
    write_threshold(tmp_path, "shop", 20.0, when=1.0)
    before = (tmp_path / FILENAME).read_text()
    with pytest.raises(ValueError):
        write_threshold(tmp_path, site, rps)
    assert (tmp_path / FILENAME).read_text() == before


def test_remove_and_missing(tmp_path):
    assert read_thresholds(tmp_path) == {}
    write_threshold(tmp_path, "shop", 20.0)
    write_threshold(tmp_path, "blog", 2.0)
    assert remove_threshold(tmp_path, "shop")
    assert set(read_thresholds(tmp_path)) == {"blog"}
    assert remove_threshold(tmp_path, "blog")
    assert not (tmp_path / FILENAME).exists()
    assert not remove_threshold(tmp_path, "blog")

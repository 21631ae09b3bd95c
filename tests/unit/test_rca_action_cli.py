"""`promreflex rca analyse`: flags and its answer when Prometheus cannot be read (the success
path runs against the real stack in tests/e2e/test_rca_mesh.py)."""

from __future__ import annotations

import argparse

import pytest

from controllers.rca.cli import register
from promreflex.cli import main
from promreflex.proc import free_port


def test_analyse_flags():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["rca", "analyse", "--prometheus.url", "http://127.0.0.1:1", "--resources", "process",
                              "--window", "1m", "--threshold", "500ms"])
    assert (args.prometheus_url, args.resources, args.window, args.threshold, args.baseline) == (
        "http://127.0.0.1:1", "process", 60.0, 0.5, 900.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["rca", "analyse", "--resources", "kubelet"])
    with pytest.raises(SystemExit):
        parser.parse_args(["rca", "analyse", "--step", "0s"])


def test_analyse_without_prometheus_says_so(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["rca", "analyse", "--prometheus.url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rca analyse: cannot read the call graph or latencies from {url}")

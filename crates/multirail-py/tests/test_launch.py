"""Endpoint.from_env() in ranks started by `multirail run -n 2`."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def multirail_bin():
    """MULTIRAIL_BIN, `multirail` on PATH, or the workspace's build."""
    if os.environ.get("MULTIRAIL_BIN"):
        return os.environ["MULTIRAIL_BIN"]
    found = shutil.which("multirail")
    if found:
        return found
    for profile in ("release", "debug"):
        p = HERE.parents[2] / "target" / profile / "multirail"
        if p.exists():
            return str(p)
    return None


def test_from_env_under_multirail_run():
    exe = multirail_bin()
    if exe is None:
        pytest.skip("no multirail binary: cargo build --release, or set MULTIRAIL_BIN")
    env = {**os.environ, "MULTIRAIL_RAILS": "tcp:127.0.0.1,tcp:127.0.0.2", "MULTIRAIL_SHM": "off"}
    out = subprocess.run(
        [exe, "run", "-n", "2", "--", sys.executable, str(HERE / "from_env_ranks.py")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.splitlines())
    assert lines == ["rank 0 of 2 got 'from 1'", "rank 1 of 2 got 'from 0'"], out.stdout + out.stderr

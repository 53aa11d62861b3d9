"""The benchmark scripts docs/performance.md tells a reader to run, run small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_stream_proxies_prints_each_proxys_rate_against_passthrough(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "stream_proxies.py"),
         "--proxies", "passthrough,permissions", "--count", "50", "--prompts", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:]}
    assert set(rows) == {"passthrough", "permissions"}
    times = "\N{MULTIPLICATION SIGN}"
    assert rows["passthrough"][1] == f"{times}1.00"
    assert rows["permissions"][0].endswith("k")
    assert rows["permissions"][1].startswith(times)

"""Small notebooks for the runner tests: ``tiny`` records through taskloss.results.start (imports torch), ``bare``
imports nothing heavy (a kernel run takes ~2 s) and logs ``seed,sleep,pid`` of each execution to ``log_path``."""
from __future__ import annotations

from pathlib import Path

import pytest

TINY = '''# %% [markdown]
# # tiny

# %% tags=["parameters"]
seed: int = 0
sleep: float = 0.0
fail: bool = False
scale: float = 1.0
label: str = "x"
values: list[float] = [1.0, 2.0]
log_path: str = ""
output_dir: str = ""

# %%
import time
import taskloss.results.run as tn
run = tn.start("tiny", output_dir, device="cpu", seed=seed)
if log_path:
    with open(log_path, "a") as f:
        f.write(f"{seed},{sleep}\\n")
time.sleep(sleep)
assert not fail, "asked to fail"
run.record("score", seed * scale + sum(values), headline=True)
run.record("label", label)
'''

BARE = '''# %% tags=["parameters"]
seed: int = 0
sleep: float = 0.0   # [≥ 0] seconds asleep in the second cell
fail: bool = False
log_path: str = ""
output_dir: str = ""

# %%
import json, os, pathlib, time
if log_path:
    with open(log_path, "a") as f:
        f.write(f"{seed},{sleep},{os.getpid()}\\n")

# %%
time.sleep(sleep)
assert not fail, "asked to fail"

# %%
results = {"notebook": "bare", "headline": ["score"], "results": {"score": seed + 0.5}}
pathlib.Path(output_dir or ".").joinpath("results.json").write_text(json.dumps(results))
'''


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "nb" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def tiny(tmp_path) -> Path:
    return _write(tmp_path, "00_tiny.py", TINY)


@pytest.fixture
def bare(tmp_path) -> Path:
    return _write(tmp_path, "00_bare.py", BARE)


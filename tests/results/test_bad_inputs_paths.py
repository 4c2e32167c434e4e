"""Issue 42: a path argument of the results API is resolved inside its run folder or refused."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from taskloss.results import RESULTS_FILE, Run, start  # noqa: E402


@pytest.fixture
def run(tmp_path):
    return Run(name="t", dir=tmp_path / "run", device=torch.device("cpu"), seed=0)


@pytest.fixture
def fig():
    f, _ = plt.subplots(figsize=(1, 1))
    yield f
    plt.close(f)


@pytest.mark.parametrize("bad", ["../../escape.png", "../escape", "sub/../../escape.png"])
def test_savefig_refuses_a_path_out_of_the_run_folder(run, fig, bad, tmp_path):
    run.dir.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ValueError, match="outside the run folder"):
        run.savefig(fig, bad)
    assert not list(tmp_path.glob("escape*")) and not (tmp_path.parent / "escape.png").exists()


def test_savefig_refuses_absolute_paths_symlinks_out_and_the_results_file(run, fig, tmp_path):
    run.dir.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ValueError, match="relative path"):
        run.savefig(fig, str(tmp_path / "abs.png"))
    (run.dir / "link").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ValueError, match="outside the run folder"):
        run.savefig(fig, "link/out.png")
    with pytest.raises(ValueError, match=RESULTS_FILE):
        run.savefig(fig, RESULTS_FILE)
    with pytest.raises(TypeError, match="filename must be a str"):
        run.savefig(fig, 3)
    with pytest.raises(TypeError, match="fig must be a matplotlib figure"):
        run.savefig("fig", "a.png")


def test_savefig_inside_the_folder_and_a_subfolder(run, fig):
    run.dir.mkdir(parents=True, exist_ok=True)
    p = run.savefig(fig, "figs/loss")
    assert p == (run.dir / "figs" / "loss.png").resolve() and p.stat().st_size > 0


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "..", 3])
def test_start_refuses_a_name_with_folders(name, tmp_path):
    with pytest.raises((ValueError, TypeError)):
        start(name, str(tmp_path / "out"), device="cpu")

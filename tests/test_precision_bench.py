"""The machinery of benchmarks/bench_precision.py (issue 45): a cell is the error against float64 on the same
inputs, a lost direction is marked, a refusal is quoted, the same noise reaches every dtype, and every method family
the issue names has a row. The rows themselves are the benchmark's (seconds each), not run here."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_precision.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("_bench_precision", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                   # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def _row(bench, fn, autocast=False):
    return bench.Row("test", "probe", "vector", "-", fn, autocast)


def test_a_cell_is_the_relative_error_and_cosine_against_float64_on_the_same_inputs(bench):
    x = torch.linspace(-1, 1, 101, dtype=torch.float64)

    def exp_row(env, kind):
        return env.cast(x).exp()

    cell = bench.measure(_row(bench, exp_row), torch.bfloat16, torch.device("cpu"))
    xb = x.to(torch.bfloat16)
    want = float((xb.exp().double() - xb.double().exp()).norm() / xb.double().exp().norm())
    assert cell.text.startswith(f"{want:.1e}, cos") and not cell.flagged


def test_a_direction_lost_to_cancellation_is_marked(bench):
    big = torch.tensor([1e4, 1e4], dtype=torch.float64)
    small = torch.tensor([0.3, -0.7], dtype=torch.float64)

    def cancel_row(env, kind):
        return (env.cast(big + small) - env.cast(big))  # bfloat16 cannot hold 1e4 + 0.3: the difference is lost

    cell = bench.measure(_row(bench, cancel_row), torch.bfloat16, torch.device("cpu"))
    assert cell.flagged
    assert not bench.measure(_row(bench, cancel_row), torch.float32, torch.device("cpu")).flagged


def test_a_refusal_is_quoted_and_a_crash_is_an_error(bench):
    def refuse(env, kind):
        if env.compute != torch.float64:
            raise TypeError("no half precision here: convert to float32")
        return torch.ones(3, dtype=torch.float64)

    def crash(env, kind):
        if env.compute != torch.float64:
            raise RuntimeError("kernel not implemented")
        return torch.ones(3, dtype=torch.float64)

    cell = bench.measure(_row(bench, refuse), torch.float16, torch.device("cpu"))
    assert cell.text == "refuses" and "convert to float32" in cell.message and not cell.flagged
    cell = bench.measure(_row(bench, crash), torch.float16, torch.device("cpu"))
    assert cell.text == "error" and cell.flagged


def test_autocast_rows_run_under_autocast_over_float32(bench):
    seen = []

    def probe(env, kind):
        with env.amp_ctx():
            seen.append((env.compute, torch.is_autocast_enabled("cpu")))
        return torch.ones(2, dtype=env.compute)

    bench.measure(_row(bench, probe, autocast=True), torch.bfloat16, torch.device("cpu"))
    assert seen == [(torch.float32, True), (torch.float64, False)]


def test_same_noise_gives_every_dtype_the_rounded_float64_draws(bench):
    with bench.same_noise():
        a = torch.randn(40, generator=torch.Generator().manual_seed(3), dtype=torch.bfloat16)
        b = torch.empty(40, dtype=torch.float16).normal_(0.0, 2.0, generator=torch.Generator().manual_seed(3))
    want = torch.randn(40, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(a, want.to(torch.bfloat16))
    assert torch.equal(b, (2.0 * want).to(torch.float16))
    assert torch.randn is not None and torch.Tensor.normal_.__name__ == "normal_"     # restored


def test_every_family_of_the_issue_has_a_row(bench):
    families = {r.family for r in bench.ROWS}
    methods = " ".join(r.method for r in bench.ROWS)
    assert {"losses", "dynamics", "search", "curvature", "contrastive", "attribution"} <= families
    for name in ("EMO", "F1", "clip", "MGS", "MeZO", "smoothing", "REINFORCE", "Muon", "K-FAC", "GGN", "Fisher",
                 "Hessian-free", "natural gradient", "accumulated_backward", "integrated gradients"):
        assert name in methods, name
    assert {r.model for r in bench.ROWS} >= {"mlp", "gpt2"}


def test_the_script_writes_its_table(bench, tmp_path, capsys):
    out = tmp_path / "precision.md"
    assert bench.main(["--quick", "--only", "clip", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| family | method | output | model | float32 | bfloat16 | float16 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| dynamics |")]
    assert len(rows) == 1 and "| mlp |" in rows[0]                   # --quick: the MLP rows only
    assert text in capsys.readouterr().out

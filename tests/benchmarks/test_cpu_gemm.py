"""benchmarks.kernels.cpu_gemm: XLA:CPU's GEMMs with YNNPACK fusion on and off, at toy sizes."""

import json

import pytest

from benchmarks.kernels import cpu_gemm
from vjx.worker.step_layout import YNN_FUSION_OFF


def test_both_dot_paths_are_timed_for_every_case(tmp_path, capsys):
    path = tmp_path / "gemm.json"
    argv = ["--shapes", "64x96", "--rows", "1", "8", "--layers", "2", "--repeats", "2", "--output-json", str(path)]
    assert cpu_gemm.main(argv) == 0
    cases = json.loads(path.read_text())["cases"]
    assert [(c["in"], c["out"], c["rows"]) for c in cases] == [(64, 96, 1), (64, 96, 8)]
    for case in cases:
        assert case["ynn_on_s"] > 0 and case["ynn_off_s"] > 0
        assert case["ynn_off_gb_per_s"] == pytest.approx(64 * 96 * 4 / case["ynn_off_s"] / 1e9)
    assert capsys.readouterr().out.count("| 64x96 |") == 2


def test_ynn_off_compiles_without_ynn_fusions():
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(lambda x, w: x @ w).lower(jnp.ones((8, 576)), jnp.ones((576, 960)))
    assert "__ynn_fusion" in lowered.compile().as_text()
    assert "__ynn_fusion" not in lowered.compile(compiler_options=YNN_FUSION_OFF).as_text()


@pytest.mark.parametrize("shape", ["576", "0x5", "ax5"])
def test_bad_shapes_are_refused(shape):
    with pytest.raises(ValueError, match="INxOUT"):
        cpu_gemm.main(["--shapes", shape])

"""The pre-launch batch check through the real CLI: ``dualtrain run`` refuses a batchnorm run with
too few values per channel before anything is written. (The spec, the canonical layout and the
check itself, in process: tests/spec/test_batchnorm_spec.py.)"""

from __future__ import annotations

from testkit.cli import run_cli


def test_cli_refuses_before_anything_is_written(tmp_path):
    cfg = tmp_path / "spec.yaml"
    cfg.write_text(
        "data: {batch_size: 64, train_limit: 2561}\nmodel:\n  layers:\n"
        "    - {type: flatten}\n    - {type: dense, units: 8}\n    - {type: batchnorm}\n"
        "    - {type: dense, units: 10}\n"
    )
    out = tmp_path / "out"
    proc = run_cli("run", "--backend", "torch", "--config", str(cfg), "--out", str(out), timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "at step 41" in lines[0] and "replica 0 holds 1 sample" in lines[0]
    ), lines
    assert not out.exists()

"""Bad input to --resume and --resume-from: one line on stderr, exit code 2, nothing overwritten."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dualtrain.runtime import checkpoint
from testkit.cli import ROOT, require, run_cli

require("torch")

MLP = str(ROOT / "configs" / "mnist_mlp.yaml")
SETS = (
    "data.train_limit=1300",
    "data.test_limit=500",
    "train.epochs=2",
    "train.checkpoint_every=5",
    "train.log_every=1000",
    "distribution.world_size=1",
)


def sets(*extra: str) -> list[str]:
    return [a for s in (*SETS, *extra) for a in ("--set", s)]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A torch run killed at step 12 (checkpoints at 5 and 10)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        MLP,
        *sets("debug.exit_rank=[12, 0]"),
        "--out",
        str(out),
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert checkpoint.complete_steps(out) == [5, 10]
    return out


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def copy(stopped: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


def one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout[-1500:], proc.stderr[-1500:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def latest_file(run: Path, name: str) -> Path:
    return run / "checkpoints" / "step-00000010" / name


@pytest.mark.parametrize(
    "damage,needles",
    [
        ("truncate", ("weights.npz is truncated or changed",)),
        ("tamper", ("optimizer.npz does not match its checksum",)),
        ("missing", ("is missing state.json",)),
        ("no_manifest", ("no complete checkpoint",)),
    ],
)
def test_damaged_latest_checkpoint_is_refused(stopped, tmp_path, damage, needles):
    run = copy(stopped, tmp_path)
    if damage == "truncate":
        f = latest_file(run, "weights.npz")
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "tamper":
        f = latest_file(run, "optimizer.npz")
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "missing":
        latest_file(run, "state.json").unlink()
    else:  # both manifests gone: no checkpoint counts as complete
        for d in (run / "checkpoints").iterdir():
            (d / "MANIFEST.json").unlink()
    before = digest(run)
    one_line_error(run_cli("run", "--resume", str(run), timeout=120), *needles)
    assert digest(run) == before  # nothing overwritten, records not cut


def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    one_line_error(run_cli("run", "--resume", str(tmp_path), timeout=120), "not a dualtrain run")
    one_line_error(
        run_cli("run", "--resume", str(tmp_path / "nope"), timeout=120),
        "--resume needs a run directory",
    )


def test_checkpoint_of_another_spec_is_refused(stopped, tmp_path):
    ckpt = stopped / "checkpoints" / "step-00000010"
    before = digest(stopped)
    out = tmp_path / "new"
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        MLP,
        *sets("optimizer.lr=0.5"),
        "--resume-from",
        str(ckpt),
        "--out",
        str(out),
        timeout=120,
    )
    one_line_error(
        proc, "is of another training run: optimizer.lr: 0.1 in the checkpoint, 0.5 here"
    )
    proc = run_cli(
        "run",
        "--backend",
        "tf",
        "--config",
        MLP,
        *sets("model.preset=cnn"),
        "--resume-from",
        str(ckpt),
        "--out",
        str(out),
        timeout=120,
    )
    one_line_error(proc, "model.preset: 'mlp' in the checkpoint, 'cnn' here")
    assert not out.exists() and digest(stopped) == before


def test_resume_refuses_flags_that_would_change_the_run(stopped, tmp_path):
    run = copy(stopped, tmp_path)
    before = digest(run)
    one_line_error(
        run_cli("run", "--resume", str(run), "--set", "optimizer.lr=1", timeout=120),
        "--resume continues the run's own spec",
        "--set",
    )
    one_line_error(
        run_cli("run", "--resume", str(run), "--backend", "tf", timeout=120),
        "--resume continues on the checkpoint's backend (torch)",
        "--resume-from",
    )
    assert digest(run) == before


@pytest.mark.slow
def test_torch_sampler_cannot_change_the_world_size(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        MLP,
        *sets("data.sharding=torch_sampler", "data.batch_size=64", "debug.exit_rank=[12, 0]"),
        "--out",
        str(out),
        timeout=300,
    )
    assert proc.returncode == 1
    before = digest(out)
    one_line_error(
        run_cli("run", "--resume", str(out), "--world-size", "2", timeout=120),
        "torch_sampler",
        "world_size 1",
    )
    assert digest(out) == before


@pytest.mark.slow
def test_finished_run_is_not_resumed(stopped, tmp_path):
    run = copy(stopped, tmp_path)
    proc = run_cli("run", "--resume", str(run), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    one_line_error(run_cli("run", "--resume", str(run), timeout=120), "has finished")


def _mistakes(stopped: Path, tmp: Path):
    """(name, overrides, out, resume_from, environment) of one mistake each."""
    (tmp / "a_file").write_text("x")
    (tmp / "foreign").mkdir()
    (tmp / "foreign" / "notes.txt").write_text("mine")
    orphan = tmp / "orphan" / checkpoint.DIR / "10"  # a checkpoint without its run's records
    shutil.copytree(checkpoint.latest(stopped), orphan)
    torchrun = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
    }
    wider = "model={layers: [{type: dense, units: 64}, {type: relu}, {type: dense, units: 10}]}"
    ckpt = checkpoint.latest(stopped)
    return [
        ("out is a file", [], tmp / "a_file", None, {}),
        ("out holds other files", [], tmp / "foreign", None, {}),
        ("out holds a run", [], stopped, None, {}),
        (
            "no training step",
            ["data.train_limit=10", "data.batch_size=64", "data.last_batch=drop"],
            tmp / "new",
            None,
            {},
        ),
        ("resume-from is no checkpoint", [], tmp / "new", tmp / "foreign", {}),
        ("resume-from without its records", [], tmp / "new", orphan, {}),
        ("resume-from of another model", [wider], tmp / "new", ckpt, {}),
        ("resume-from under torchrun", [], tmp / "new", ckpt, torchrun),
        ("restarted rank, another model", [wider], stopped, None, torchrun),
    ]


def test_the_dry_run_and_the_run_refuse_the_same_mistakes_alike(stopped, tmp_path, monkeypatch):
    """One code path (runs.resolve_run) decides for both: each mistake gives the same one line from
    the dry run and from the run itself, and neither writes anything."""
    from dualtrain.driver.dryrun import plan_run
    from dualtrain.driver.runs import start_run
    from dualtrain.errors import UserError
    from dualtrain.spec import Backend, load_spec

    cases = _mistakes(stopped, tmp_path)
    before = digest(tmp_path), digest(stopped)
    for name, extra, out, resume_from, env in cases:
        spec = load_spec(MLP, [*SETS, *extra])
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            said = []
            for how in (plan_run, start_run):
                with pytest.raises(UserError) as err:
                    how(spec, Backend.TORCH, out, resume_from=resume_from)
                said.append(str(err.value))
        assert said[0] == said[1], (name, said)
        assert "\n" not in said[0], (name, said[0])
        assert (digest(tmp_path), digest(stopped)) == before, name

"""``dualtrain run --dry-run --json`` as a launcher would start it: an environment without the test
process's own launcher variables, and the plan the CLI prints."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from testkit.cli import ROOT, cli_env

CONFIG = str(ROOT / "configs" / "mnist_mlp.yaml")  # world_size 2
EXAMPLES = ROOT / "examples"
#: Variables of any launcher the test process itself may run under: never leak them into a case.
LAUNCHER_VARS = re.compile(
    r"SLURM_|SLURMD_|PET_|TORCHELASTIC_|TF_CONFIG$|(LOCAL_)?RANK$|"
    r"(LOCAL_)?WORLD_SIZE$|MASTER_(ADDR|PORT)$|KUBERNETES_|DUALTRAIN_(SLURM|TF_)"
)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in cli_env().items() if not LAUNCHER_VARS.match(k)}
    env.update(extra or {})
    return env


def dry_run(backend: str, env: dict[str, str], *args: str) -> dict:
    """``dualtrain run --dry-run --json`` in a subprocess with ``env`` added; the plan."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dualtrain",
            "run",
            "--backend",
            backend,
            "--config",
            CONFIG,
            *args,
            "--dry-run",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=clean_env(env),
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # stdout is exactly one JSON object


def batch_script_env() -> dict[str, str]:
    """What the sbatch script itself sees: PROCID 0, NTASKS N, and no step variables
    (Slurm's env_array_for_batch_job)."""
    return {
        "SLURM_JOB_ID": "4123",
        "SLURM_JOB_NAME": "dualtrain",
        "SLURM_JOB_NODELIST": "node[01-02]",
        "SLURM_NODELIST": "node[01-02]",
        "SLURM_NTASKS": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "ENVIRONMENT": "BATCH",
    }

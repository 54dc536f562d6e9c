"""Backend registry. Only ``dualtrain.backends.torch`` imports torch and only
``dualtrain.backends.tf`` imports tensorflow/keras; each package's ``launch`` module is
framework-free (the CLI process uses it to plan the worker processes without importing the
framework).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Protocol, cast

from dualtrain.errors import UserError
from dualtrain.launch.forkserver import Warm
from dualtrain.spec import Backend

if TYPE_CHECKING:
    import re
    from collections.abc import Mapping

    from dualtrain.launch import cluster
    from dualtrain.launch.local import Worker
    from dualtrain.spec import Experiment

PACKAGES = {Backend.TORCH: "dualtrain.backends.torch", Backend.TF: "dualtrain.backends.tf"}
REQUIRES = {Backend.TORCH: ("torch",), Backend.TF: ("tensorflow", "keras")}


def parse_backend(name: str) -> Backend:
    return Backend.parse(name, "--backend")  # torch, tf, or an alias: pytorch, tensorflow, keras


def check_installed(backend: Backend) -> None:
    for mod in REQUIRES[backend]:
        if importlib.util.find_spec(mod) is None:
            raise UserError(
                f"backend {backend.value!r} needs {mod}, which is not installed: "
                f"pip install 'dualtrain[{backend.value}]' -c constraints.txt"
            )


class LaunchModule(Protocol):
    """What each backend's framework-free ``launch`` module provides (both modules are checked
    against it by mypy at the end of this file)."""

    @property
    def MODULE(self) -> str:
        """The backend package the workers run as ``python -m``."""

    @property
    def UNIT(self) -> str:
        """What one worker process is called in messages ("rank", "worker")."""

    @property
    def STDERR_NOISE(self) -> re.Pattern[bytes] | None:
        """The workers' stderr lines the launcher leaves out
        (dualtrain.launch.local.run_workers)."""

    @property
    def PRELOAD(self) -> tuple[str, ...]:
        """The modules a warm server imports before forking workers (dualtrain.launch.forkserver):
        the framework and the backend's modules a worker imports."""

    @property
    def BASE_PREIMPORT(self) -> dict[str, str]:
        """What every process of the backend sets before importing its framework, whatever the
        spec (its tools' too)."""

    def preimport_env(self, spec: Experiment) -> dict[str, str]:
        """What a worker sets in its environment before importing its framework."""

    def detect(self, env: Mapping[str, str] | None = None) -> cluster.Launcher | None:
        """The external launcher that started this process as one rank, if any (reads only)."""

    def workers(self, spec: Experiment) -> list[Worker]:
        """The worker processes dualtrain starts itself for ``spec``."""

    def check_devices(self, spec: Experiment) -> None:
        """Raise UserError when ``spec``'s device is not there (asks a child process)."""


def launch_module(backend: Backend) -> LaunchModule:
    """The backend's framework-free launch module (worker planning, external-launch detection)."""
    return cast(LaunchModule, importlib.import_module(PACKAGES[backend] + ".launch"))


def tools_warm(backend: Backend) -> Warm:
    """How ``python -m dualtrain.backends.<name>.tools`` can be forked warm
    (dualtrain.launch.forkserver): the backend's PRELOAD, with what its processes set before the
    import whatever the spec (TF's log level, as its workers set it)."""
    launch = launch_module(backend)
    return Warm(launch.PRELOAD, dict(launch.BASE_PREIMPORT))


if TYPE_CHECKING:  # mypy checks both launch modules against the protocol (never run)
    from dualtrain.backends.tf import launch as _tf_launch
    from dualtrain.backends.torch import launch as _torch_launch

    _torch_checked: LaunchModule = _torch_launch
    _tf_checked: LaunchModule = _tf_launch

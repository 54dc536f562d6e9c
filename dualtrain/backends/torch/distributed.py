"""A torch rank's set-up before its engine: determinism and kernel settings, the device, and the
default process group with its rendezvous store (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dualtrain.errors import UserError
from dualtrain.launch.local import LISTEN_FD_ENV, open_listener
from dualtrain.spec import Device, Experiment


class DeviceUnavailable(UserError):
    """distribution.device asks for hardware this machine does not have."""


#: DUALTRAIN_TORCH_MKLDNN=0 turns torch's oneDNN (mkldnn) CPU kernels off (a portability setting).
MKLDNN_ENV = "DUALTRAIN_TORCH_MKLDNN"


def configure_determinism(on: bool) -> None:
    """docs/architecture.md "Determinism". Must run before the first CUDA/cuBLAS call."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)
    # use_deterministic_algorithms also NaN-fills every new tensor; nothing here reads uninitialised
    # memory, so that fill only costs time (a few % per step on the MLP).
    # torch defines this setting as a property of the module's class (torch/utils/deterministic.py),
    # which its type information does not show
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    # TF32 off in both modes: fp32 must mean fp32 (TF is configured the same way).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # A kernel setting for portability checks (docs/parity.md §7): DUALTRAIN_TORCH_MKLDNN=0 turns
    # torch's oneDNN (mkldnn) CPU kernels off, as TF_ENABLE_ONEDNN_OPTS does for TensorFlow.
    if os.environ.get(MKLDNN_ENV, "").strip() == "0":
        # a bool at runtime (a ContextProp on the module's class), annotated as the ContextProp
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]


def select_device(spec: Experiment, local_rank: int) -> torch.device:
    if spec.distribution.device is Device.GPU:
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                "distribution.device is 'gpu' but torch sees no CUDA device "
                f"(torch {torch.__version__}). Received: 'gpu'"
            )
        if local_rank >= torch.cuda.device_count():
            raise DeviceUnavailable(
                f"local rank {local_rank} needs GPU {local_rank} but only "
                f"{torch.cuda.device_count()} are visible. Received: 'gpu'"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(spec: Experiment, device: torch.device, rank: int, world: int) -> None:
    """The default process group (gloo on CPU, nccl on GPU)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    timeout = timedelta(seconds=spec.distribution.timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent hosts the store on MASTER_PORT (it owns that listener); every rank is a
        # client, as init_method="env://" would make it, under the same "default_pg" prefix. A
        # worker torchrun restarted would find the previous attempt's keys there (gloo's peer
        # addresses among them) and connect to dead processes (pytorch/pytorch#135712): a prefix per
        # attempt keeps them apart.
        agent = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world,
            is_master=False,
            timeout=timeout,
        )
        prefix = "default_pg" if attempt == "0" else f"dualtrain/attempt_{attempt}"
        dist.init_process_group(
            backend=backend,
            store=dist.PrefixStore(prefix, agent),
            rank=rank,
            world_size=world,
            timeout=timeout,
            **kwargs,
        )
        return
    store = rendezvous_store(rank, world, timeout)
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs
    )


def rendezvous_store(rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT, as init_method="env://" makes it, except
    that rank 0 listens only on the address the user named (loopback for runs dualtrain launches),
    not on every interface as TCPStore does by itself (dualtrain.launch.local.open_listener), on
    the socket dualtrain's launcher opened for it before any rank started when there is one. The
    store serves on that socket's descriptor for the rest of the process: the socket object lets
    it go (``detach``), so no collection closes it."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    handed = os.environ.get(LISTEN_FD_ENV)
    sock = socket.socket(fileno=int(handed)) if handed else open_listener(addr, port)
    return dist.TCPStore(
        addr,
        port,
        world,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )

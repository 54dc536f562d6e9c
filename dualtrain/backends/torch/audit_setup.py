"""What the torch audit recorder reads from a script's objects before the first step: the
world, the checks of its setup, the weights in canonical names, the configuration (optimizer,
scheduler, GradScaler, loader and sampler, BatchNorm layers, parameter dtype)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dualtrain.audit import meeting, record
from dualtrain.audit.optimizers import SCHEDULER_KEYS
from dualtrain.errors import UserError, shown

_SCALAR = (int, float, bool, str, type(None))


def _options(obj: Any) -> dict[str, Any]:
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in vars(obj).items()
        if not k.startswith("_") and (isinstance(v, _SCALAR) or isinstance(v, tuple))
    }


def world_of() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def meet(rank: int, world: int) -> None:
    """The recorders of every rank meet before the first collective (dualtrain.audit.meeting),
    through the process group's store; without one there is nothing to meet through."""
    store = getattr(dist.distributed_c10d, "_get_default_store", lambda: None)()
    if store is None:
        return
    meeting.meet(
        rank,
        world,
        lambda key: store.set(key, "1"),
        lambda key: bool(store.check([key])),
        noun="rank",
        when="it meets the others' before its first collective",
    )


def same_world(world: int) -> None:
    """The process group the recorder was made in is the one training: a recorder made before
    init_process_group would take each process for a chief of a world of one."""
    _, now = world_of()
    if now != world:
        raise UserError(
            f"the audit recorder was made in a world of {world} process(es) but the loop trains "
            f"in {now}: make it after torch.distributed.init_process_group, in every process. "
            f"Received: world size {world} at the recorder, {now} now"
        )


def prepare(run_dir: Path, rank: int, world: int, model: Any) -> bool:
    """The chief prepares the folder; every process learns whether it could (an all-reduce
    on the model's device), so a folder the chief refuses is one line in every process, not
    a hang of the others at their first collective."""
    if world > 1:
        meet(rank, world)  # before the folder: a lone recorder writes nothing
    error = None
    if rank == 0:
        try:
            record.prepare(run_dir, "torch")
        except UserError as e:
            error = e
    if world > 1:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        failed = torch.tensor([0 if error is None else 1], device=device)
        dist.all_reduce(failed)
        if error is None and int(failed.item()):
            raise UserError(
                f"the chief process (rank 0) could not prepare the audit folder (its error "
                f"says why). Received: {str(run_dir)!r}"
            )
    if error is not None:
        raise error
    return True


def check_setup(model: Any, optimizer: Any, sampler: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise UserError(
            f"torch_recorder's model must be a torch.nn.Module. Received: {shown(model)}"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(
            f"torch_recorder's optimizer must be a torch.optim.Optimizer. Received: "
            f"{shown(optimizer)}"
        )
    rank, world = world_of()
    if isinstance(sampler, torch.utils.data.DistributedSampler) and sampler.num_replicas != world:
        group = "no process group is initialised" if world == 1 else f"the group has {world}"
        raise UserError(
            f"the DistributedSampler splits the data over {sampler.num_replicas} replicas but "
            f"{group} (call torch.distributed.init_process_group before the recorder). Received: "
            f"num_replicas={sampler.num_replicas}"
        )


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a trainer's wrapper (Accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer: each keeps it as ``.optimizer`` and steps it, so its step
    hooks and param groups are the ones that run)."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def unwrapped(model: Any) -> Any:
    """The user's module inside DDP's and torch.compile's wrappers (in either order)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as NumPy (bfloat16, which NumPy lacks, as float32: every value exactly)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy().copy()


def canonical_weights(model: Any) -> dict[str, np.ndarray]:
    """The state dict (DDP's ``module.`` and torch.compile's ``_orig_mod.`` unwrapped) as NumPy,
    without counters."""
    return {
        k: _numpy(v)
        for k, v in unwrapped(model).state_dict().items()
        if not k.endswith("num_batches_tracked")
    }


def param_digests(model: Any, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """The digests of the parameters among ``weights`` (canonical_weights'): buffers such as
    BatchNorm's running statistics are each rank's own under DDP and are left out."""
    names = {n for n, _ in unwrapped(model).named_parameters()}
    return record.digests({n: w for n, w in weights.items() if n in names})


def loader_part(loader: Any, name: str) -> Any:
    """The loader's sampler, batch_size or drop_last, from its batch sampler (a
    ``DataLoader(batch_sampler=BatchSampler(DistributedSampler(...), ...))`` has the default
    SequentialSampler and no batch_size of its own); None without a loader."""
    batches = getattr(loader, "batch_sampler", None)
    if isinstance(batches, torch.utils.data.BatchSampler):
        return getattr(batches, name, None)
    return getattr(loader, name, None)


def loader_len(loader: Any) -> int | None:
    """The loader's batches per epoch; None for an iterable dataset without a length."""
    try:
        return len(loader) if loader is not None else None
    except TypeError:
        return None


def _optimizer_config(optimizer: Any, model: Any) -> dict[str, Any]:
    """The optimizer's type and first group's options (with several groups, every group's
    options but the lr, which the lr check judges, under ``groups``, and the names of the
    parameters each holds under ``group_params``); a wrapper that holds the optimizer
    (ZeroRedundancyOptimizer's ``optim``) is named by what it wraps."""
    inner = getattr(optimizer, "optim", None)
    groups = [
        record_safe({k: v for k, v in g.items() if k != "params"}) for g in optimizer.param_groups
    ]
    out = {"type": type(optimizer).__name__, **groups[0]}
    if len(groups) > 1:
        out["groups"] = [{k: v for k, v in g.items() if k not in SCHEDULER_KEYS} for g in groups]
        names = {id(p): n for n, p in unwrapped(model).named_parameters()}
        out["group_params"] = [
            [names[id(p)] for p in g["params"] if id(p) in names] for g in optimizer.param_groups
        ]
    if isinstance(inner, torch.optim.Optimizer):
        out |= {"type": type(inner).__name__, "wrapper": type(optimizer).__name__}
    return out


#: layers whose training and eval modes compute otherwise
MODE_LAYERS = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)


def read_config(
    model: Any, optimizer: Any, scaler: Any, loader: Any, sampler: Any, sched: Any
) -> dict[str, Any]:
    inner = unwrapped(model)
    dtypes = [p.dtype for p in inner.parameters() if p.is_floating_point()]
    cfg: dict[str, Any] = {
        "optimizer": _optimizer_config(optimizer, model),
        "precision": {"param_dtype": str(dtypes[0]).removeprefix("torch.")} if dtypes else {},
        "batchnorm": [
            {
                "name": n,
                "momentum": m.momentum,
                "eps": m.eps,
                "convention": "torch",
                "synchronized": isinstance(m, torch.nn.SyncBatchNorm),  # over all ranks' rows
            }
            for n, m in inner.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        ],
        "mode_layers": [  # layers that compute otherwise in eval mode (model.eval())
            f"{n} ({type(m).__name__})"
            for n, m in inner.named_modules()
            if isinstance(m, MODE_LAYERS)
        ],
        "random_layers": [  # layers drawing random numbers in training (dropout)
            f"{n} ({type(m).__name__})"
            for n, m in inner.named_modules()
            if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0  # (p=0: none)
        ],
        "ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel)
        or isinstance(getattr(model, "_orig_mod", None), torch.nn.parallel.DistributedDataParallel),
    }
    cfg["frozen"] = {n: p.numel() for n, p in inner.named_parameters() if not p.requires_grad}
    if scaler is not None and scaler.is_enabled():
        state = scaler.state_dict()
        cfg["loss_scale"] = {
            "type": "GradScaler",
            "initial_scale": float(state["scale"]),
            "growth_interval": int(state["growth_interval"]),
            "growth_factor": float(state["growth_factor"]),
            "backoff_factor": float(state["backoff_factor"]),
        }
    if sched is not None:
        cfg["scheduler"] = {"type": type(sched).__name__, **_options(sched)}
    if loader is not None:
        cfg["loader"] = {
            "batch_size": loader_part(loader, "batch_size"),
            "drop_last": loader_part(loader, "drop_last"),
            "batches": loader_len(loader),
            "dataset": type(getattr(loader, "dataset", None)).__name__,
        }
    if sampler is not None:
        cfg["sampler"] = {"type": type(sampler).__name__, **_options(sampler)}
        cfg["sampler"]["dataset_size"] = (
            len(sampler.dataset) if hasattr(sampler, "dataset") else None
        )
    return cfg


def first_step_config(config: dict[str, Any], model: Any, optimizer: Any) -> None:
    """The optimizer as the first step starts (groups a script adds after making the recorder,
    ``add_param_group`` for a head it trains from the start, included) and the trainable
    parameters it does not hold then."""
    config["optimizer"] = _optimizer_config(optimizer, model)
    missing = _not_held(unwrapped(model), optimizer)
    if missing:
        config["not_held"] = missing


def final_config(config: dict[str, Any], optimizer: Any) -> None:
    """``not_held`` less the parameters a group added during the run holds (a layer unfrozen
    and given to the optimizer at a later epoch): those the optimizer never held."""
    missing = config.pop("not_held", None)
    if missing:
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        names = [n for n in missing["names"] if missing["ids"][n] not in held]
        if names:
            config["not_held"] = {"names": names, "of": missing["of"]}


def _not_held(inner: Any, optimizer: Any) -> dict[str, Any] | None:
    """The trainable parameters the recorded optimizer does not hold (a second optimizer's, or
    parameters the script never updates): their lr and options go unrecorded, so the recorder
    says so as it starts and the record keeps their names for compare."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
    names = [n for n, p in trainable if id(p) not in held]
    if not names:
        return None
    if world_of()[0] == 0:
        shown_names = ", ".join(names[:4]) + (
            f" and {len(names) - 4} more" if len(names) > 4 else ""
        )
        print(
            f"dualtrain audit: the recorded optimizer holds {len(trainable) - len(names)} of the "
            f"model's {len(trainable)} trainable parameters; {shown_names} are another "
            f"optimizer's or never updated, and their lr and options are not recorded",
            file=sys.stderr,
        )
    ids = {n: id(p) for n, p in trainable if id(p) not in held}  # for final_config
    return {"names": names, "of": len(trainable), "ids": ids}


def record_safe(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in d.items()
        if isinstance(v, _SCALAR) or isinstance(v, tuple)
    }

"""The BatchNorm diagnoses: the running statistics' momentum convention (torch's ``m`` keeps
``1 - m``, Keras's keeps ``m``), eps, and batch statistics synchronised over the replicas
(torch's SyncBatchNorm, Keras's ``BatchNormalization(synchronized=True)``) in one run only."""

from __future__ import annotations

from dualtrain.audit import conventions as C
from dualtrain.audit.config import BatchNormLayer
from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Finding


def _kept(bn: BatchNormLayer) -> float | None:
    """The share of the running statistics a BatchNorm keeps per step (torch: running = (1 - m)
    running + m batch; Keras: running = m running + (1 - m) batch); None for torch's
    ``momentum=None``, a cumulative average (1 - 1/n at the n-th step)."""
    m = bn.momentum
    if m is None:
        return None
    return 1 - m if bn.convention == "torch" else m


def _keeps(bn: BatchNormLayer) -> str:
    kept = _kept(bn)
    return "a cumulative average (1 - 1/n at step n)" if kept is None else f"{kept:g}"


def batchnorm(a: Recorded, b: Recorded) -> list[Finding]:
    ba, bb = a.config.batchnorm, b.config.batchnorm
    out = []
    for x, y in zip(ba, bb, strict=False):
        keep_x, keep_y = _kept(x), _kept(y)
        if not C.same_value(keep_x, keep_y):
            out.append(
                f"{x.name}/{y.name}: A keeps {_keeps(x)} of the running statistics per step "
                f"(momentum={x.momentum}, {x.convention}'s convention), B {_keeps(y)} "
                f"(momentum={y.momentum}, {y.convention}'s)"
            )
        if not C.same_value(x.eps, y.eps):
            out.append(f"{x.name}/{y.name}: eps {x.eps:g} in A, {y.eps:g} in B")
    if not out:
        return []
    x, y = next(
        (x, y)
        for x, y in zip(ba, bb, strict=False)
        if not C.same_value(_kept(x), _kept(y)) or not C.same_value(x.eps, y.eps)
    )
    mixed = any(p.convention != q.convention for p, q in zip(ba, bb, strict=False))
    name = "BatchNorm momentum convention" if mixed else "different BatchNorm settings"
    fixes = [fix(a, "A", BN_LINES[a.framework], _bn_args(x.convention, y))]
    fixes.append(fix(b, "B", BN_LINES[b.framework], _bn_args(y.convention, x)))
    if mixed:
        fixes.append(
            "torch momentum m is Keras momentum 1 - m (torch 0.1 = Keras 0.9; Keras's default "
            "0.99); eps 1e-5 (torch) vs 1e-3 (Keras)"
        )
    return [Finding(name, "; ".join(out), fixes)]


BN_LINES = {"torch": ("BatchNorm", "momentum="), "tf": ("BatchNormalization(", "momentum=")}


def _bn_args(convention: str, other: BatchNormLayer) -> str:
    """The other run's BatchNorm written in ``convention``'s arguments."""
    kept = _kept(other)
    if convention == "torch":
        m = "None" if kept is None else f"{1 - kept:.6g}"
        return f"momentum={m}, eps={other.eps:g} (the other run's, in torch's convention)"
    if kept is None:
        return "no Keras momentum is a cumulative average: give the torch BatchNorm a momentum"
    return f"momentum={kept:.6g}, epsilon={other.eps:g} (the other run's, in Keras's convention)"


#: how each framework writes synchronised BatchNorm, and plain
SYNC_ARGS = {
    "torch": (
        "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP wraps it "
        "(CUDA only)",
        "plain BatchNorm layers (no convert_sync_batchnorm)",
    ),
    "tf": ("BatchNormalization(synchronized=True)", "BatchNormalization(synchronized=False)"),
}
#: where to change it: (framework, synchronised now) -> the lines to quote
SYNC_LINES = {
    ("torch", True): ("convert_sync_batchnorm", "SyncBatchNorm"),
    ("torch", False): ("DistributedDataParallel(", "DDP("),  # where the model is wrapped
    ("tf", True): ("synchronized=", "BatchNormalization("),
    ("tf", False): ("BatchNormalization(",),
}


def synchronized(a: Recorded, b: Recorded) -> list[Finding]:
    """BatchNorm's batch statistics over all replicas' rows in one run, each replica's own in
    the other (only where a run has several replicas; a record without the field: not judged)."""
    ba, bb = a.config.batchnorm, b.config.batchnorm
    if max(a.world_size, b.world_size) < 2:
        return []
    pairs = [
        (x, y)
        for x, y in zip(ba, bb, strict=False)
        if x.synchronized is not None
        and y.synchronized is not None
        and x.synchronized != y.synchronized
    ]
    if not pairs:
        return []
    x, y = pairs[0]
    sync, plain = ("A", "B") if x.synchronized else ("B", "A")
    n = max(a.world_size, b.world_size)
    names = ", ".join(f"{p.name}/{q.name}" for p, q in pairs[:4])
    return [
        Finding(
            "BatchNorm statistics synchronised in one run only",
            f"{names}: {sync}'s BatchNorm normalises each step with the mean and variance of "
            f"the global batch (all {n} replicas' rows), {plain}'s with each replica's own rows "
            f"(the losses and the running statistics differ from step 1)",
            [
                fix(
                    run,
                    tag,
                    SYNC_LINES[run.framework, bool(bn.synchronized)],
                    SYNC_ARGS[run.framework][bool(bn.synchronized)],
                )
                for run, tag, bn in ((a, "A", x), (b, "B", y))
            ],
        )
    ]

"""The end of a run of several ranks: they leave together (the TF backend's cluster.py is its
twin for multi_worker tasks)."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def leave_together(rank: int, world: int, timeout_s: float) -> None:
    """Return once every rank has finished its last collective, and (rank 0) once every other rank
    knows it: then no rank closes a gloo/nccl connection a peer still reads from, and rank 0, which
    hosts the rendezvous store when dualtrain launches the ranks, outlives every store client.

    This is a handshake over the rendezvous store (request/response, so an acknowledged ``add`` is
    delivered), not ``dist.barrier()`` + ``destroy_process_group()``: a CI run saw one rank of three
    never return from that pair after the other two had finished (pytorch/pytorch#75097 reports the
    same), and the launcher had to stop it after ``timeout_s``.
    """
    if world == 1:
        return
    store = dist.distributed_c10d._get_default_store()
    timeout = timedelta(seconds=timeout_s)
    if store.add("dualtrain/finished", 1) == world:
        store.set("dualtrain/all_finished", "1")
    store.wait(["dualtrain/all_finished"], timeout)
    if rank == 0:
        store.wait(["dualtrain/all_released"], timeout)
    elif store.add("dualtrain/released", 1) == world - 1:
        store.set("dualtrain/all_released", "1")

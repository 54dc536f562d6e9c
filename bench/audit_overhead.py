"""What the torch audit recorder costs per step on the MNIST CNN (examples/audit/ddp_mnist.py's
Net, batch 64, one process, CPU), as a ratio measured within one run.

The run alternates blocks of ``--block`` steps: plain steps (the recorder's optimizer hooks
removed, no ``rec.batch``/``rec.step``) and recorded steps (hooks on, both calls made), so the two
kinds share the machine's state and noise. Reported: the step time of each kind, the
overhead ``recorded / plain - 1`` by the means (which count the digests' batched work every
``Digests.STEPS`` steps; target: at most 5%) and by the medians, and ``close()``'s one-off cost.

    python bench/audit_overhead.py [--blocks 10] [--block 10] [--threads 1]
        [--device cuda] [--data random] [--amp]

``--data random``: MNIST-shaped random inputs (where the MNIST copy is not installed; the cost
does not depend on the values). ``--amp``: autocast (float16 on CUDA, bfloat16 on CPU) and a
GradScaler, whose scale the recorder reads each step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "audit"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ddp_mnist import Net, mnist_train  # noqa: E402

import dualtrain.audit  # noqa: E402
from dualtrain.backends.torch.audit_digests import Digests  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10, help="pairs of blocks")
    p.add_argument("--block", type=int, default=10, help="steps per block")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default="mnist", choices=["mnist", "random"])
    p.add_argument("--amp", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.batch * 2 * args.blocks * args.block
    if args.data == "mnist":
        data = mnist_train(n)
    else:
        data = torch.utils.data.TensorDataset(torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch)
    dev = torch.device(args.device)
    model = Net().to(dev)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler(dev.type) if args.amp else None
    low = torch.float16 if dev.type == "cuda" else torch.bfloat16
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    with tempfile.TemporaryDirectory() as tmp:
        rec = dualtrain.audit.torch_recorder(
            Path(tmp) / "rec", model=model, optimizer=opt, scaler=scaler
        )
        batches = iter(loader)
        for i in range(2 * args.blocks):
            kind = "recorded" if i % 2 else "plain"
            if kind == "plain":
                for h in rec.hooks:
                    h.remove()
            else:
                rec.hooks = [
                    opt.register_step_pre_hook(rec._pre),
                    opt.register_step_post_hook(rec._post),
                ]
            for _ in range(args.block):
                x, y = next(batches)
                x, y = x.to(dev), y.to(dev)
                sync()
                t0 = time.perf_counter()
                if kind == "recorded":
                    rec.batch(x)
                opt.zero_grad()
                with torch.autocast(dev.type, dtype=low, enabled=args.amp):
                    loss = F.nll_loss(model(x).float(), y)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
                if kind == "recorded":
                    rec.step(loss)
                sync()
                times[kind].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rec.close()
        close_s = time.perf_counter() - t0
    plain, recorded = statistics.median(times["plain"]), statistics.median(times["recorded"])
    mean_p, mean_r = statistics.fmean(times["plain"]), statistics.fmean(times["recorded"])
    print(
        f"MNIST CNN on {args.device}{' amp' if args.amp else ''}, batch {args.batch}, "
        f"{args.threads} thread(s), {len(times['plain'])} plain and {len(times['recorded'])} "
        f"recorded steps in one run:\n"
        f"  plain step    {mean_p * 1e3:.2f} ms mean, {plain * 1e3:.2f} ms median\n"
        f"  recorded step {mean_r * 1e3:.2f} ms mean, {recorded * 1e3:.2f} ms median\n"
        f"  overhead      {mean_r / mean_p - 1:+.1%} of a step by the means (the digests' "
        f"batched work every {Digests.STEPS} steps included), {recorded / plain - 1:+.1%} by "
        f"the medians; target <= +5%\n"
        f"  close()       {close_s * 1e3:.0f} ms once (merging and writing the record)"
    )


if __name__ == "__main__":
    main()

"""What the torch audit recorder costs per step on the MNIST CNN (examples/audit/ddp_mnist.py's
Net, batch 64, one process, CPU), as a ratio measured within one run.

The run alternates blocks of ``--block`` steps: plain steps (the recorder's optimizer hooks
removed, no ``rec.batch``/``rec.step``) and recorded steps (hooks on, both calls made), so the two
kinds share the machine's state and noise. Reported: the median step time of each kind, the
overhead ``recorded / plain - 1`` (target: at most 5%), and ``close()``'s one-off cost.

    python bench/audit_overhead.py [--blocks 10] [--block 10] [--threads 1]
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

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ddp_mnist import Net, mnist_train  # noqa: E402

import dualtrain.audit  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10, help="pairs of blocks")
    p.add_argument("--block", type=int, default=10, help="steps per block")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = mnist_train(args.batch * 2 * args.blocks * args.block)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch)
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    with tempfile.TemporaryDirectory() as tmp:
        rec = dualtrain.audit.torch_recorder(Path(tmp) / "rec", model=model, optimizer=opt)
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
                t0 = time.perf_counter()
                if kind == "recorded":
                    rec.batch(x)
                opt.zero_grad()
                loss = F.nll_loss(model(x), y)
                loss.backward()
                opt.step()
                if kind == "recorded":
                    rec.step(loss)
                times[kind].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rec.close()
        close_s = time.perf_counter() - t0
    plain, recorded = statistics.median(times["plain"]), statistics.median(times["recorded"])
    ratio = recorded / plain - 1
    spread = np.percentile(np.array(times["recorded"]) / plain - 1, [25, 75])
    print(
        f"MNIST CNN, batch {args.batch}, {args.threads} thread(s), {len(times['plain'])} plain "
        f"and {len(times['recorded'])} recorded steps in one run:\n"
        f"  plain step    {plain * 1e3:.2f} ms (median)\n"
        f"  recorded step {recorded * 1e3:.2f} ms (median)\n"
        f"  overhead      {ratio:+.1%} of a step (recorded steps' quartiles {spread[0]:+.1%} .. "
        f"{spread[1]:+.1%}); target <= +5%\n"
        f"  close()       {close_s * 1e3:.0f} ms once (merging and writing the record)"
    )


if __name__ == "__main__":
    main()

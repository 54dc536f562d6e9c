"""What the audit's Lightning callback costs per step on the MNIST CNN (examples/audit's Net, batch
64, one process, CPU), as a ratio measured within one run.

The run alternates fits of ``--block`` steps: plain (no recorder) and recorded (the callback in
the Trainer's list), so both share the machine's state and noise. A step is timed from the first
callback's ``on_train_batch_start`` to the last one's ``on_train_batch_end`` (the recorder's two
calls inside); each fit's first step is left out. Reported: the step time of each kind and the
overhead ``recorded / plain - 1`` by the means (target: at most 5%) and by the medians.

    python bench/audit_overhead_lightning.py [--blocks 6] [--block 20] [--threads 1]
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

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ddp_mnist import Net, mnist_train  # noqa: E402

import dualtrain.audit  # noqa: E402


class LitNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.nll_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adadelta(self.parameters(), lr=1.0)


class Clock(pl.Callback):
    """Starts a step's clock (first in the list) or stops it (last)."""

    def __init__(self, times: list[float], start: bool) -> None:
        self.times, self.start = times, start

    def on_train_batch_start(self, trainer, module, batch, i) -> None:
        if self.start:
            self.t0 = time.perf_counter()
            Clock.began = self.t0

    def on_train_batch_end(self, trainer, module, outputs, batch, i) -> None:
        if not self.start and i > 0:  # each fit's first step warms up
            self.times.append(time.perf_counter() - Clock.began)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=6, help="pairs of fits")
    p.add_argument("--block", type=int, default=20, help="steps per fit")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(mnist_train(64 * args.block), batch_size=64)
    model = LitNet()
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2 * args.blocks):
            kind = "recorded" if i % 2 else "plain"
            rec = [dualtrain.audit.lightning_recorder(Path(tmp) / f"rec{i}")] if i % 2 else []
            start, stop = Clock(times[kind], True), Clock(times[kind], False)
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=1,
                max_epochs=1,
                callbacks=[start, *rec, stop],
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            )
            trainer.fit(model, loader)
    plain, recorded = times["plain"], times["recorded"]
    by_means = statistics.mean(recorded) / statistics.mean(plain) - 1
    by_medians = statistics.median(recorded) / statistics.median(plain) - 1
    print(
        f"steps: {len(plain)} plain, {len(recorded)} recorded; median step "
        f"{1e3 * statistics.median(plain):.1f} ms plain, {1e3 * statistics.median(recorded):.1f} "
        f"ms recorded; overhead {100 * by_means:+.1f}% by the means, {100 * by_medians:+.1f}% by "
        f"the medians"
    )


if __name__ == "__main__":
    main()

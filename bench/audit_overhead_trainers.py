"""What the audit's trainer callbacks cost per step on the MNIST CNN (examples/audit's Net, batch
64, one process, CPU), as a ratio measured within one run: the Lightning callback
(``--trainer lightning``) or the Hugging Face Trainer's (``--trainer transformers``: the Net
returning the Trainer's dict).

The run alternates trainings of ``--block`` steps: plain (no recorder) and recorded (the callback
in the trainer's list), so both share the machine's state and noise. A step is timed from the
first callback's step start to the last one's step end (the recorder's work inside: Lightning's
``on_train_batch_start``/``_end``, the Trainer's ``on_step_begin``/``_end`` with the recorder's
forward hooks between); each training's first step is left out. Reported: the step time of each
kind and the overhead ``recorded / plain - 1`` by the means (target: at most 5%) and by the
medians; and the time spent inside the recorder's own calls (the callback's entry points and the
optimizer-step hooks, timed around each call) per recorded step, against the plain step's
median: a share the machine's noise between trainings does not move.

    python bench/audit_overhead_trainers.py --trainer lightning [--blocks 6] [--block 20]
    python bench/audit_overhead_trainers.py --trainer transformers
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "audit"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ddp_mnist import Net, mnist_train  # noqa: E402

import dualtrain.audit  # noqa: E402


class Clock:
    """Starts a step's clock (first in the callbacks) or stops it (last); hooks under both
    trainers' names."""

    began = 0.0

    def __init__(self, times: list[float], start: bool) -> None:
        self.times, self.start, self.n = times, start, 0

    def begin(self) -> None:
        if self.start:
            Clock.began = time.perf_counter()

    def end(self) -> None:
        self.n += 1
        if not self.start and self.n > 1:  # each training's first step warms up
            self.times.append(time.perf_counter() - Clock.began)


#: seconds spent inside the recorder's calls, summed over every recorded training
INSIDE = [0.0]


def timed(owner: Any, name: str) -> None:
    """Time each call of ``owner.name`` into :data:`INSIDE` (the outermost call only)."""
    real, depth = getattr(owner, name), [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        began = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                INSIDE[0] += time.perf_counter() - began

    setattr(owner, name, call)


def watch_inside() -> None:
    """The recorder's entry points under both trainers: the callbacks' Recording (each
    micro-batch's rows, each step's loss), the forward hooks of the Trainer's recorder, and the
    TorchRecorder's optimizer-step hooks (registered when it is made, so patched before)."""
    from dualtrain.backends.torch import audit as torch_audit  # lazy: framework
    from dualtrain.backends.torch import audit_trainers  # lazy: framework

    for name in ("batch", "end"):
        timed(audit_trainers.Recording, name)
    for name in ("_pre", "_post"):
        timed(torch_audit.TorchRecorder, name)


def lightning(times: dict[str, list[float]], blocks: int, block: int, tmp: Path) -> None:
    import lightning.pytorch as pl  # lazy: heavy (one trainer a run)

    class LitNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.nll_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adadelta(self.parameters(), lr=1.0)

    class LitClock(Clock, pl.Callback):
        def on_train_batch_start(self, *a: Any) -> None:
            self.begin()

        def on_train_batch_end(self, *a: Any) -> None:
            self.end()

    loader = torch.utils.data.DataLoader(mnist_train(64 * block), batch_size=64)
    model = LitNet()
    for i in range(2 * blocks):
        kind = "recorded" if i % 2 else "plain"
        rec = [dualtrain.audit.lightning_recorder(tmp / f"r{i}")] if i % 2 else []
        pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=1,
            callbacks=[LitClock(times[kind], True), *rec, LitClock(times[kind], False)],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        ).fit(model, loader)


def transformers(times: dict[str, list[float]], blocks: int, block: int, tmp: Path) -> None:
    import transformers as hf  # lazy: heavy (one trainer a run)

    class DictNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def forward(self, pixel_values: Any, labels: Any = None) -> Any:
            out = self.net(pixel_values)
            return {"loss": F.nll_loss(out, labels), "logits": out}

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.data = mnist_train(n)

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i: int) -> Any:
            x, y = self.data[i]
            return {"pixel_values": x, "labels": y}

    class HfClock(Clock, hf.TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.begin()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.end()

    data, model = Rows(64 * block), DictNet()
    for i in range(2 * blocks):
        kind = "recorded" if i % 2 else "plain"
        rec = [dualtrain.audit.transformers_recorder(tmp / f"r{i}")] if i % 2 else []
        args = hf.TrainingArguments(
            output_dir=str(tmp / "out"),
            per_device_train_batch_size=64,
            num_train_epochs=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            logging_strategy="no",
        )
        clocks = [HfClock(times[kind], True), *rec, HfClock(times[kind], False)]
        hf.Trainer(model=model, args=args, train_dataset=data, callbacks=clocks).train()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainer", choices=["lightning", "transformers"], required=True)
    p.add_argument("--blocks", type=int, default=6, help="pairs of trainings")
    p.add_argument("--block", type=int, default=20, help="steps per training")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    run = lightning if args.trainer == "lightning" else transformers
    watch_inside()
    with tempfile.TemporaryDirectory() as tmp:
        run(times, args.blocks, args.block, Path(tmp))
    plain, recorded = times["plain"], times["recorded"]
    by_means = statistics.mean(recorded) / statistics.mean(plain) - 1
    by_medians = statistics.median(recorded) / statistics.median(plain) - 1
    print(
        f"{args.trainer}: {len(plain)} plain steps, {len(recorded)} recorded; median step "
        f"{1e3 * statistics.median(plain):.1f} ms plain, {1e3 * statistics.median(recorded):.1f} "
        f"ms recorded; overhead {100 * by_means:+.1f}% by the means, {100 * by_medians:+.1f}% by "
        f"the medians"
    )
    inside = INSIDE[0] / (len(recorded) + args.blocks)  # (each training's first step is timed too)
    print(
        f"{args.trainer}: inside the recorder {1e3 * inside:.2f} ms a step, "
        f"{100 * inside / statistics.median(plain):.1f}% of the plain step's median"
    )


if __name__ == "__main__":
    main()

"""What the audit's Hugging Face Trainer callback costs per step on the MNIST CNN (examples/audit's
Net, returning the Trainer's dict, batch 64, one process, CPU), as a ratio measured within one
run.

The run alternates trainings of ``--block`` steps: plain (no recorder) and recorded (the callback
in the Trainer's list), so both share the machine's state and noise. A step is timed from the
first callback's ``on_step_begin`` to the last one's ``on_step_end`` (the recorder's forward hooks
and its step's close inside); each training's first step is left out. Reported: the step time of
each kind and the overhead ``recorded / plain - 1`` by the means (target: at most 5%) and by the
medians.

    python bench/audit_overhead_transformers.py [--blocks 6] [--block 20] [--threads 1]
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
import transformers  # noqa: E402
from ddp_mnist import Net, mnist_train  # noqa: E402

import dualtrain.audit  # noqa: E402


class DictNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, pixel_values, labels=None):
        out = self.net(pixel_values)
        return {"loss": F.nll_loss(out, labels), "logits": out}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.data = mnist_train(n)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i]
        return {"pixel_values": x, "labels": y}


class Clock(transformers.TrainerCallback):
    """Starts a step's clock (first in the list) or stops it (last)."""

    began = 0.0

    def __init__(self, times: list[float], start: bool) -> None:
        self.times, self.start, self.n = times, start, 0

    def on_step_begin(self, args, state, control, **kw) -> None:
        if self.start:
            Clock.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kw) -> None:
        self.n += 1
        if not self.start and self.n > 1:  # each training's first step warms up
            self.times.append(time.perf_counter() - Clock.began)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=6, help="pairs of trainings")
    p.add_argument("--block", type=int, default=20, help="steps per training")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data, model = Rows(64 * args.block), DictNet()
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2 * args.blocks):
            kind = "recorded" if i % 2 else "plain"
            rec = [dualtrain.audit.transformers_recorder(Path(tmp) / f"r{i}")] if i % 2 else []
            training = transformers.TrainingArguments(
                output_dir=str(Path(tmp) / "out"),
                per_device_train_batch_size=64,
                num_train_epochs=1,
                save_strategy="no",
                report_to=[],
                use_cpu=True,
                disable_tqdm=True,
                logging_strategy="no",
            )
            clocks = [Clock(times[kind], True), *rec, Clock(times[kind], False)]
            transformers.Trainer(
                model=model, args=training, train_dataset=data, callbacks=clocks
            ).train()
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

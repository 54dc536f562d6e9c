"""PyTorch Lightning's MNIST example (the LitMNIST module of Lightning's "MNIST: hello world"
notebook: an MLP with dropout, Adam at 2e-4, NLL of log-softmax) on real MNIST, trained by a
Lightning ``Trainer`` with DDP over 2 CPU processes, recorded for dualtrain's audit.

The two lines marked AUDIT are all dualtrain adds. Then, with its Keras port::

    python examples/audit/lightning/lit_mnist.py --out runs/audit_lightning
    python examples/audit/lightning/keras_mnist.py --torch-record runs/audit_lightning \\
        --out runs/audit_lightning_keras
    dualtrain compare runs/audit_lightning runs/audit_lightning_keras

The flags after ``--seed`` each change one thing a team might (tests/audit uses them).
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dualtrain.audit  # AUDIT
from dualtrain.core.data import mnist
from dualtrain.spec import DataSpec


class LitMNIST(pl.LightningModule):
    def __init__(self, hidden_size=64, learning_rate=2e-4, dropout=0.1, warmup=0, decay=0.0):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, 10),
        )

    def forward(self, x):
        x = self.model(x)
        return F.log_softmax(x, dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.nll_loss(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = torch.optim.Adam(self.parameters(), lr=hp.learning_rate, weight_decay=hp.decay)
        if not hp.warmup:
            return optimizer
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, 0.25, total_iters=hp.warmup)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def mnist_train(size: int) -> TensorDataset:
    arrays = mnist.read_source(mnist.locate(DataSpec()))  # real MNIST, offline
    x = arrays["train_images"][:size].astype(np.float32)[:, None] / 255.0
    x = (x - 0.1307) / 0.3081  # transforms.Normalize((0.1307,), (0.3081,))
    y = arrays["train_labels"][:size].astype(np.int64)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/audit_lightning")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-size", type=int, default=2048, help="the first N training images")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=0, help="steps of a LinearLR warmup")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=None, help="Trainer(gradient_clip_val=)")
    p.add_argument("--accumulate", type=int, default=1, help="Trainer(accumulate_grad_batches=)")
    args = p.parse_args()

    pl.seed_everything(args.seed)
    torch.set_num_threads(1)
    model = LitMNIST(64, args.lr, args.dropout, args.warmup, args.weight_decay)
    loader = DataLoader(mnist_train(args.train_size), batch_size=args.batch_size, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_epochs=args.epochs,
        gradient_clip_val=args.clip,
        accumulate_grad_batches=args.accumulate,
        callbacks=[dualtrain.audit.lightning_recorder(args.out)],  # AUDIT
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()

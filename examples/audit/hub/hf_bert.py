"""A Hugging Face ``Trainer`` fine-tuning a tiny random-init BERT classifier (no download) on a
synthetic token task, recorded for dualtrain's audit; its initial model is saved with
``save_pretrained`` for the Keras side, where KerasHub's own converter loads it.

The two lines marked AUDIT are all dualtrain adds. Then, with its KerasHub port::

    python examples/audit/hub/hf_bert.py --out runs/audit_hf --initial runs/audit_hf_initial
    python examples/audit/hub/keras_hub_bert.py --initial runs/audit_hf_initial \\
        --torch-record runs/audit_hf --out runs/audit_keras_hub
    dualtrain compare runs/audit_hf runs/audit_keras_hub

The flags after ``--seed`` each change one thing a team might (tests/audit uses them).
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import dualtrain.audit  # AUDIT

VOCAB, LENGTH, CLASSES = 64, 16, 3


def token_task(n: int, seed: int) -> dict[str, np.ndarray]:
    """Sequences of token ids; the label: which third of the id range holds most of them."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(n, LENGTH))
    labels = np.argmax([np.sum(ids // (VOCAB // CLASSES + 1) == c, axis=1) for c in range(3)], 0)
    return {"input_ids": ids, "labels": labels}


class TokenTask(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int):
        self.data = token_task(n, seed)

    def __len__(self) -> int:
        return len(self.data["labels"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.as_tensor(self.data["input_ids"][i])
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids),
            "labels": torch.as_tensor(self.data["labels"][i]),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/audit_hf")
    p.add_argument("--initial", default="runs/audit_hf_initial", help="save_pretrained here")
    p.add_argument("--train-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--hidden", type=int, default=32, help="the model's width (heads of 16)")
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 16,
        intermediate_size=2 * args.hidden,
        max_position_embeddings=LENGTH,
        num_labels=CLASSES,
    )
    model = BertForSequenceClassification(config)
    model.save_pretrained(args.initial)  # the Keras side converts this folder
    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        logging_steps=8,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=args.seed,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=TokenTask(args.train_size, args.seed),
        callbacks=[dualtrain.audit.transformers_recorder(args.out)],  # AUDIT
    )
    trainer.train()


if __name__ == "__main__":
    main()

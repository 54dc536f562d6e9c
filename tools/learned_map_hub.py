"""The learned weight map (dualtrain.core.pair.learn) on KerasHub's own Hugging Face converters: a
tiny random-init Hugging Face model saved with ``save_pretrained``, converted by KerasHub's
``Backbone.from_preset`` on that folder (the converter users trust), once per probe pass on the
distinct values, then checked on the real weights. Needs transformers and keras-hub (the ``hub``
extra, which ``make`` installs).

    python -m tools.learned_map_hub gpt2 bert llama vit
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.pair import learn as L
from dualtrain.errors import UserError


def _tiny(name: str) -> tuple[Any, Any, str]:
    """(the Hugging Face model, KerasHub's backbone class, the prefix its converter reads)."""
    import keras_hub  # lazy: heavy (the optional hub packages)
    import transformers  # lazy: heavy

    small = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
        return transformers.GPT2Model(cfg), keras_hub.models.GPT2Backbone, ""
    if name == "bert":
        cfg = transformers.BertConfig(vocab_size=64, max_position_embeddings=64, **small)
        return transformers.BertModel(cfg), keras_hub.models.BertBackbone, ""
    if name == "llama":
        cfg = transformers.LlamaConfig(
            num_key_value_heads=2, vocab_size=64, max_position_embeddings=64, **small
        )
        return transformers.LlamaForCausalLM(cfg), keras_hub.models.LlamaBackbone, ""
    if name == "vit":
        cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, **small)
        return transformers.ViTModel(cfg), keras_hub.models.ViTBackbone, "vit."
    raise SystemExit(f"unknown model {name!r} (gpt2, bert, llama, vit)")


def learn_one(name: str, folder: Path) -> str:
    import keras  # lazy: heavy
    from safetensors.numpy import load_file, save_file  # lazy: heavy

    model, backbone, prefix = _tiny(name)
    model.save_pretrained(folder / "src", safe_serialization=True)
    real = {prefix + k: v for k, v in load_file(folder / "src" / "model.safetensors").items()}
    shutil.copytree(folder / "src", folder / "probe")

    def convert(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        save_file(
            {k: np.ascontiguousarray(v) for k, v in t.items()},
            folder / "probe" / "model.safetensors",
        )
        net = backbone.from_preset(str(folder / "probe"))
        return {w.path: keras.ops.convert_to_numpy(w) for w in net.weights}

    t0 = time.perf_counter()
    try:
        m = L.learn({k: v.shape for k, v in real.items()}, convert, real=real)
    except UserError as exc:
        return f"{name}: {exc}"
    views = sum(s.view is not None for s in m.sources)
    shared = f"; tied: {', '.join(m.shared)}" if m.shared else ""
    return (
        f"{name}: {len(real)} torch arrays onto {len(m.sources)} Keras variables ({views} strided "
        f"views), checked on the real weights, in {time.perf_counter() - t0:.1f} s{shared}"
    )


def main(names: list[str]) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in names or ["gpt2", "bert", "llama", "vit"]:
        with tempfile.TemporaryDirectory(prefix=f"learned-map-{name}-") as tmp:
            print(learn_one(name, Path(tmp)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

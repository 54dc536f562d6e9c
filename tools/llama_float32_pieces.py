"""Why a Hugging Face Llama and its KerasHub port differ in float64 (issue 47: "Llama 3 by 4.8e-7,
far above float64 rounding"): a minimal reproduction an upstream maintainer can run. A tiny
random-init ``LlamaForCausalLM`` in float64, converted by KerasHub's own converter
(``LlamaBackbone.from_preset`` on its ``save_pretrained`` folder, dtype float64), one forward pass
of the same token ids; then each side again with the pieces it computes in float32 whatever the
model's dtype moved to float64:

* Hugging Face: ``LlamaRMSNorm`` casts its input to float32; the rotary inverse frequencies are
  computed in float32 (then stored in the model's dtype), and the rotary table's forward casts
  them and the positions with ``.float()``;
* KerasHub: ``LlamaLayerNorm`` (RMSNorm) casts to float32, the SiLU gate is computed in float32,
  the rotary positions and inverse frequencies are float32 ``arange``s, and the attention softmax
  is a ``Softmax(dtype="float32")`` layer.

Measured (transformers 5.23.0, keras-hub 0.32.0, width 64, 2 layers, 16 tokens): as shipped
7.2e-7 apart (outputs of size ~4); Hugging Face's float32 pieces alone move its output by 3.4e-7,
KerasHub's by 4.9e-7; with neither, the two agree to 1.3e-15. A limit of both libraries in float64,
not a porting mistake. Needs transformers and keras-hub importable (issue 47's ``hub`` extra, not
installed by ``make``).

    python -m tools.llama_float32_pieces
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np


def _keras_hub_in_float64() -> None:
    """KerasHub's Llama modules with their float32 casts, aranges and softmax kept in float64."""
    import keras  # lazy: heavy (the optional hub packages)
    from keras_hub.src.layers.modeling import rotary_embedding  # lazy: heavy
    from keras_hub.src.models.llama import (  # lazy: heavy
        llama_attention,
        llama_decoder,
        llama_layernorm,
        llama_rotary_embedding,
    )

    wide = {"float32": "float64"}
    cast, arange, softmax_init = keras.ops.cast, keras.ops.arange, keras.layers.Softmax.__init__

    class Ops:
        def __getattr__(self, name: str) -> Any:
            if name == "cast":
                return lambda x, dtype: cast(x, wide.get(str(dtype), dtype))
            if name == "arange":
                return lambda *a, dtype=None, **k: arange(
                    *a, dtype=wide.get(str(dtype), dtype), **k
                )
            return getattr(keras.ops, name)

    for mod in (
        llama_layernorm,
        llama_decoder,
        llama_rotary_embedding,
        llama_attention,
        rotary_embedding,
    ):
        mod.ops = Ops()

    def softmax(self: Any, *a: Any, **k: Any) -> None:
        k["dtype"] = wide.get(str(k.get("dtype")), k.get("dtype"))
        softmax_init(self, *a, **k)

    keras.layers.Softmax.__init__ = softmax


def _hugging_face_in_float64(model: Any, head_dim: int, theta: float) -> None:
    import torch  # lazy: framework
    from transformers.models.llama import modeling_llama  # lazy: heavy

    def rms(self: Any, x: Any) -> Any:
        return self.weight * (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        )

    modeling_llama.LlamaRMSNorm.forward = rms
    rotary = model.model.rotary_emb
    rotary.inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    )

    def table(x: Any, position_ids: Any) -> tuple[Any, Any]:  # its forward casts with .float()
        inv = rotary.inv_freq.double()[None, :, None].expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].double()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = rotary.attention_scaling
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    rotary.forward = table


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # lazy: heavy

    keras.config.set_floatx("float64")  # before KerasHub builds anything without a dtype of its own
    import keras_hub  # lazy: heavy
    import torch  # lazy: framework
    import transformers  # lazy: heavy

    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    ids = np.random.default_rng(0).integers(0, 128, (2, 16))
    mask = np.ones_like(ids)

    def hf() -> np.ndarray:
        with torch.no_grad():
            out = model.model(torch.tensor(ids), attention_mask=torch.tensor(mask))
        return out.last_hidden_state.numpy()

    def kh(folder: str) -> np.ndarray:
        net = keras_hub.models.LlamaBackbone.from_preset(folder, dtype="float64")
        return keras.ops.convert_to_numpy(net({"token_ids": ids, "padding_mask": mask}))

    with tempfile.TemporaryDirectory(prefix="llama-f64-") as folder:
        model.save_pretrained(folder, safe_serialization=True)
        hf_as_is, kh_as_is = hf(), kh(folder)
        theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
        _hugging_face_in_float64(model, cfg.hidden_size // cfg.num_attention_heads, theta)
        _keras_hub_in_float64()
        hf_64, kh_64 = hf(), kh(folder)
    size = float(np.abs(hf_as_is).max())
    print(f"as shipped: {np.abs(hf_as_is - kh_as_is).max():.3g} apart (outputs up to {size:.3g})")
    print(f"Hugging Face's float32 pieces alone: {np.abs(hf_as_is - hf_64).max():.3g}")
    print(f"KerasHub's float32 pieces alone: {np.abs(kh_as_is - kh_64).max():.3g}")
    print(f"both in float64: {np.abs(hf_64 - kh_64).max():.3g} apart")


if __name__ == "__main__":
    main()

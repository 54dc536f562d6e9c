"""Learning a weight map from values (dualtrain.core.pair.learn) at GPT-2 small's size: the time
and the peak memory of learning the map of a NumPy stand-in for KerasHub's GPT-2 converter (12
blocks of width 768, a 50,257-token vocabulary: 124M parameters, past one pass of ids, so two),
checked on the real arrays, against the two models' own memory.

    python bench/bench_learned_map.py [--layers 12] [--width 768] [--vocab 50257]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from dualtrain.core.pair import learn as L


def gpt2_shapes(layers: int, d: int, vocab: int, positions: int = 1024) -> dict[str, tuple]:
    shapes: dict[str, tuple] = {"wte.weight": (vocab, d), "wpe.weight": (positions, d)}
    for i in range(layers):
        p = f"h.{i}."
        shapes |= {
            p + "ln_1.weight": (d,),
            p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d),
            p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d),
            p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,),
            p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, 4 * d),
            p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (4 * d, d),
            p + "mlp.c_proj.bias": (d,),
        }
    return shapes | {"ln_f.weight": (d,), "ln_f.bias": (d,)}


def converter(layers: int, d: int, heads: int):
    """KerasHub's GPT-2 checkpoint conversion's moves (HF Conv1D kernels are (in, out) already)."""
    hd = d // heads

    def convert(t):
        out = {"token_embedding": t["wte.weight"], "position_embedding": t["wpe.weight"]}
        for i in range(layers):
            p, k = f"h.{i}.", f"transformer_layer_{i}/"
            w, b = t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"]
            for j, part in enumerate(("query", "key", "value")):
                out[k + part + "/kernel"] = w[:, j * d : (j + 1) * d].reshape(d, heads, hd)
                out[k + part + "/bias"] = b[j * d : (j + 1) * d].reshape(heads, hd)
            out[k + "attention_output/kernel"] = t[p + "attn.c_proj.weight"].reshape(heads, hd, d)
            out[k + "attention_output/bias"] = t[p + "attn.c_proj.bias"]
            for name in ("ln_1", "ln_2"):
                out[k + name + "/gamma"] = t[p + name + ".weight"]
                out[k + name + "/beta"] = t[p + name + ".bias"]
            out[k + "intermediate/kernel"] = t[p + "mlp.c_fc.weight"]
            out[k + "intermediate/bias"] = t[p + "mlp.c_fc.bias"]
            out[k + "output/kernel"] = t[p + "mlp.c_proj.weight"]
            out[k + "output/bias"] = t[p + "mlp.c_proj.bias"]
        out["layer_norm/gamma"], out["layer_norm/beta"] = t["ln_f.weight"], t["ln_f.bias"]
        return {n: np.ascontiguousarray(v) for n, v in out.items()}  # Keras holds its own copies

    return convert


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    shapes = gpt2_shapes(a.layers, a.width, a.vocab)
    n = sum(int(np.prod(s)) for s in shapes.values())
    rng = np.random.default_rng(0)
    real = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    m = L.learn(shapes, converter(a.layers, a.width, a.heads), real=real)
    took = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    models = 2 * n * 4 / 2**30
    views = sum(s.view is not None for s in m.sources)
    print(
        f"{n / 1e6:.1f}M parameters, {L.passes_for(n)} passes, {len(m.sources)} Keras variables "
        f"({views} strided views): learned and checked in {took:.1f} s; peak memory "
        f"{peak:.2f} GiB (before learning {base:.2f} GiB, the real arrays held), the two "
        f"models' float32 arrays {models:.2f} GiB: ratio {peak / models:.2f}"
    )


if __name__ == "__main__":
    main()

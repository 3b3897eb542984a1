"""How fast is ringlab.nn's hand-written backward next to torch autograd?

Forward + backward (with cross-entropy) of the same small GPT, same weights,
float64, one thread each. Prints the median time of each and the ratio
ringlab / torch. Takes a few seconds.

    python bench/nn_vs_torch.py [--repeat 20]
"""

import argparse
import os
import statistics
import time

# One BLAS thread for numpy too, set before numpy loads its BLAS: a fair 1-vs-1 race.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ringlab.nn import GPT, cross_entropy  # noqa: E402

CONFIG = dict(vocab=64, dim=64, n_heads=4, hidden=256, n_layers=2, seq_len=32)
BATCH = 8


def torch_gpt(p, ids, n_heads, n_layers):
    """The same GPT written with torch.nn.functional on ringlab's named weights."""
    def linear(pre, x):
        y = x @ p[pre + "weight"]
        return y + p[pre + "bias"] if pre + "bias" in p else y

    def norm(pre, x):
        return F.layer_norm(x, x.shape[-1:], p[pre + "weight"], p[pre + "bias"])

    B, T = ids.shape
    x = p["tok_emb.weight"][ids] + p["pos_emb.weight"][:T]
    for i in range(n_layers):
        pre = f"blocks.{i}."
        q, k, v = linear(pre + "attn.qkv.", norm(pre + "ln1.", x)).reshape(
            B, T, 3, n_heads, -1).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + linear(pre + "attn.proj.", att.transpose(1, 2).reshape(B, T, -1))
        h = F.gelu(linear(pre + "mlp.fc.", norm(pre + "ln2.", x)), approximate="tanh")
        x = x + linear(pre + "mlp.proj.", h)
    return linear("head.", norm("ln_f.", x))


def median_time(step, repeat):
    step()                                   # warm-up: first-touch allocations
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    repeat = parser.parse_args().repeat
    torch.set_num_threads(1)
    model = GPT(**CONFIG, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    ids = rng.integers(CONFIG["vocab"], size=(BATCH, CONFIG["seq_len"]))
    targets = rng.integers(CONFIG["vocab"], size=ids.shape)
    tparams = {k: torch.tensor(v, requires_grad=True)
               for k, v in model.named_parameters().items()}
    tids, ttargets = torch.tensor(ids), torch.tensor(targets).reshape(-1)

    def ours():
        model.zero_grad()
        loss, dlogits = cross_entropy(model.forward(ids), targets)
        model.backward(dlogits)

    def theirs():
        for p in tparams.values():
            p.grad = None
        logits = torch_gpt(tparams, tids, CONFIG["n_heads"], CONFIG["n_layers"])
        F.cross_entropy(logits.reshape(-1, CONFIG["vocab"]), ttargets).backward()

    t_ours, t_torch = median_time(ours, repeat), median_time(theirs, repeat)
    # Same numbers, or the comparison means nothing.
    worst = max(float(np.abs(g - tparams[k].grad.numpy()).max() / np.abs(g).max())
                for k, g in model.named_grads().items())
    print(f"GPT {CONFIG}, batch {BATCH}, float64, 1 thread; gradients agree to {worst:.1e}")
    print(f"ringlab.nn  {t_ours * 1e3:8.2f} ms   (median of {repeat})")
    print(f"torch       {t_torch * 1e3:8.2f} ms")
    print(f"ratio ringlab/torch: {t_ours / t_torch:.2f}")


if __name__ == "__main__":
    main()

"""The JAX anchor's Transformer++ with its causal attention computed in blocks of query rows.

`experiments/anchors/flash_jax.py` computes softmax attention as one [B, H, T, T] einsum, which XLA on a
CPU materialises (1 GiB of scores per layer at 8192 tokens) and evaluates in full, masked half
included. Our fused kernel (crates/model/src/fused.rs) works through blocks of query rows, stops
each block at the diagonal, and recomputes the block's scores in the backward pass. This script
times the anchor's exact model, loss and Adam step with the attention evaluated that way in JAX
(one `jax.checkpoint`ed block of query rows at a time against the keys up to its last row), so
that Transformer++'s ratio to JAX at long contexts compares like with like. Everything else is
imported from the anchor unchanged.

usage: python3 experiments/anchors/tfmpp_blockwise_jax.py [--anchor experiments/anchors/flash_jax.py]
           [--contexts 2048,4096,8192] [--block 512] [--steps 3] [--check]
`--check` also runs the anchor's own Transformer++ and prints both losses (they must agree).
Prints CSV rows like the anchor's: model,context,batch,median_s_per_step,tokens_per_s,loss.
"""
import argparse, functools, importlib.util, math, os, statistics, time
import jax, jax.numpy as jnp


def load_anchor(path):
    spec = importlib.util.spec_from_file_location("flash_jax", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention_block(q, k, v, first_row):
    """Softmax attention of query rows first_row.. against keys 0..k.shape[2]: [b, h, n, d]."""
    s = jnp.einsum("bhnd,bhmd->bhnm", q, k) / math.sqrt(q.shape[-1])
    rows = first_row + jnp.arange(q.shape[2])
    s = jnp.where(rows[:, None] >= jnp.arange(k.shape[2])[None, :], s, -1e9)
    return jnp.einsum("bhnm,bhmd->bhnd", jax.nn.softmax(s, -1), v)


def blockwise_causal_attention(q, k, v, block):
    """Causal softmax attention, [b, h, t, d] each, one block of query rows at a time."""
    t = q.shape[2]
    outs = []
    for i0 in range(0, t, block):
        i1 = min(i0 + block, t)
        f = jax.checkpoint(functools.partial(attention_block, first_row=i0))
        outs.append(f(q[:, :, i0:i1], k[:, :, :i1], v[:, :, :i1]))
    return jnp.concatenate(outs, 2)


def blockwise_tfm_block(anchor, block):
    """The anchor's `tfm_block` with only the attention line replaced."""
    def tfm_block(p, x, heads):
        b, t, d = x.shape
        h = anchor.layer_norm(x, p["ln1"])
        q, k, v = jnp.split(h @ p["wqkv"], 3, -1)
        sh = lambda y: y.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
        q, k, v = anchor.rope(sh(q)), anchor.rope(sh(k)), sh(v)
        o = blockwise_causal_attention(q, k, v, block).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + o @ p["wo"]
        h = anchor.layer_norm(x, p["ln2"])
        a, gte = jnp.split(h @ p["wi"], 2, -1)
        return x + (jax.nn.gelu(a) * gte) @ p["wf"]
    return tfm_block


def time_steps(anchor, a, t):
    """The anchor's timing loop for Transformer++ at context t: (batch, median s/step, loss)."""
    bsz = max(1, a.tokens // t)
    p = anchor.build("tfmpp", jax.random.PRNGKey(0), a)
    m = jax.tree.map(jnp.zeros_like, p)
    v = jax.tree.map(jnp.zeros_like, p)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (bsz, t + 1), 0, a.vocab)
    step = anchor.adam_step(anchor.make_loss("tfmpp", a))
    p, m, v, l = step(p, m, v, 0, tokens); l.block_until_ready()  # compile + warm-up
    times = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        p, m, v, l = step(p, m, v, i, tokens); l.block_until_ready()
        times.append(time.perf_counter() - t0)
    return bsz, statistics.median(times), float(l)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchor", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_jax.py"))
    ap.add_argument("--contexts", default="2048,4096,8192")
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    anchor = load_anchor(a.anchor)
    dense_block = anchor.tfm_block
    print("model,context,batch,median_s_per_step,tokens_per_s,loss")
    for t in map(int, a.contexts.split(",")):
        variants = [("transformer_plusplus_blockwise", blockwise_tfm_block(anchor, a.block))]
        if a.check:
            variants.append(("transformer_plusplus", dense_block))
        for name, block_fn in variants:
            anchor.tfm_block = block_fn  # make_loss looks the block up by name at trace time
            bsz, med, loss = time_steps(anchor, a, t)
            print(f"{name},{t},{bsz},{med:.4f},{bsz * t / med:.0f},{loss:.4f}", flush=True)


if __name__ == "__main__":
    main()

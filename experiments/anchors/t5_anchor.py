"""transformers' T5ForConditionalGeneration (PyTorch eager) on the rows of
`cargo run --release -p model --example t5_bench -- row NAME`: the same models, shapes, optimizer and
timing rule (the median of REPS after a warm-up), printed as `NAME,seconds`.

Rows: train_table1 and train_d512 (a span-corruption training step: forward, backward and Adafactor
with T5's settings: scale_parameter, no relative step, lr 1e-3, decay -0.8, clipping 1.0; random
inputs and targets), encoder_xxl (the encoder on one input of 2048 at T5-XXL's per-layer shapes),
decode_xxl_b1 / _b8 / _b32 (an MHA decoding step with the cache at those shapes; the cross-attention
K/V computed at the first step, which the warm-up excludes). T5.1.1: gated GELU, untied head, no
dropout.

usage: python t5_anchor.py NAME [REPS]
"""
import statistics, sys, time
import torch
from transformers import T5Config, T5ForConditionalGeneration
from transformers.optimization import Adafactor


def t5(d, dff, heads, dkv, layers, vocab):
    cfg = T5Config(vocab_size=vocab, d_model=d, d_kv=dkv, d_ff=dff, num_layers=layers,
                   num_decoder_layers=layers, num_heads=heads, feed_forward_proj="gated-gelu",
                   tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0,
                   pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg)


TRAIN = {  # (model args, (batch, input, targets)), as t5_bench's train_scale
    "train_table1": ((128, 256, 8, 32, 2, 8192), (8, 128, 128)),
    "train_d512": ((512, 1024, 8, 64, 6, 32128), (8, 512, 114)),
}
XXL = (4096, 10240, 64, 64, 1, 32128)
INPUT = 2048


def timed(warmup, reps, f):
    out = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        f()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def main():
    # Flush denormals to zero, as our binaries do (model::runtime::flush_denormals) and XLA's CPU
    # runtime does by default: on Intel CPUs, arithmetic on values below f32's smallest normal runs
    # at a small fraction of normal speed, and T5's training step (Adafactor's second moments,
    # softmax tails) makes them: train_table1 took 1.63 s without this, 0.24 s with it, on a
    # 2-core Xeon.
    torch.set_flush_denormal(True)
    name = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.manual_seed(0)
    if name in TRAIN:
        args, (b, s, t) = TRAIN[name]
        m = t5(*args).train()
        vocab = args[-1]
        x = torch.randint(2, vocab - 1, (b, s))
        y = torch.randint(2, vocab - 1, (b, t))
        opt = Adafactor(m.parameters(), lr=1e-3, scale_parameter=True, relative_step=False,
                        warmup_init=False, decay_rate=-0.8, clip_threshold=1.0)

        def step():
            loss = m(input_ids=x, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        times = timed(1, reps, step)
    elif name == "encoder_xxl":
        m = t5(*XXL).eval()
        x = torch.randint(2, 32000, (1, INPUT))
        with torch.inference_mode():
            times = timed(1, reps, lambda: m.encoder(input_ids=x).last_hidden_state)
    elif name.startswith("decode_xxl_b"):
        b = int(name[len("decode_xxl_b"):])
        m = t5(*XXL).eval()
        from transformers.cache_utils import EncoderDecoderCache, DynamicCache
        with torch.inference_mode():
            enc = torch.randn(b, INPUT, XXL[0])
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            tok = torch.ones(b, 1, dtype=torch.long)
            state = {"cache": cache}

            def step():
                out = m(encoder_outputs=(enc,), decoder_input_ids=tok,
                        past_key_values=state["cache"], use_cache=True)
                state["cache"] = out.past_key_values
            times = timed(2, reps, step)
    else:
        sys.exit(f"t5_anchor.py: row `{name}`: not one of the rows")
    print(f"{name},{statistics.median(times):.6f}")


if __name__ == "__main__":
    main()

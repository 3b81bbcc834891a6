"""HF transformers anchor for gqa_fig6: T5 (MHA) greedy-decoding step time at T5-XXL per-layer shapes.

Same work as `gqa_fig6 --profile cpu` at G = H = 64: 1 encoder + 1 decoder layer, d 4096, 64 heads x d_kv 64,
d_ff 10240 (gated GELU, T5.1.1), vocab 32128, input 2048, output 64, batch 32 (encoder run once on one
sample, its output repeated). Prints encoder seconds per sample and the median decoder step (ms) with the
KV cache (self-attention cache grows; cross-attention K/V computed at step 0, excluded from the median).
With `--device cuda` the same on a GPU (the GPU check, experiments/gpu_check), each step synchronised.

usage: python t5_decode_hf.py [--batch 32] [--input 2048] [--output 64] [--device cpu|cuda]
"""
import argparse, statistics, time
import torch
from transformers import T5Config, T5ForConditionalGeneration

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--input", type=int, default=2048)
ap.add_argument("--output", type=int, default=64)
ap.add_argument("--d", type=int, default=4096)
ap.add_argument("--heads", type=int, default=64)
ap.add_argument("--dkv", type=int, default=64)
ap.add_argument("--dff", type=int, default=10240)
ap.add_argument("--layers", type=int, default=1)
ap.add_argument("--vocab", type=int, default=32128)
ap.add_argument("--device", default="cpu", help="cpu, or cuda")
a = ap.parse_args()
dev = torch.device(a.device)
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
# Denormals flushed to zero, as our binaries and t5_anchor.py do (why: t5_anchor.py's main).
torch.set_flush_denormal(True)
torch.manual_seed(0)
cfg = T5Config(vocab_size=a.vocab, d_model=a.d, d_kv=a.dkv, d_ff=a.dff, num_layers=a.layers,
               num_decoder_layers=a.layers, num_heads=a.heads, feed_forward_proj="gated-gelu",
               tie_word_embeddings=False, dropout_rate=0.0)
m = T5ForConditionalGeneration(cfg).eval().to(dev)
where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"threads {torch.get_num_threads()}"
print(f"# torch {torch.__version__}, {a.device} ({where}), batch {a.batch}, params {sum(p.numel() for p in m.parameters())/1e6:.0f}M")
with torch.inference_mode():
    x = torch.randint(2, a.vocab, (1, a.input), device=dev)
    sync(); t0 = time.perf_counter(); enc = m.encoder(input_ids=x).last_hidden_state; sync(); te = time.perf_counter() - t0
    enc = enc.expand(a.batch, -1, -1).contiguous()
    tok = torch.zeros(a.batch, 1, dtype=torch.long, device=dev)
    from transformers.cache_utils import EncoderDecoderCache, DynamicCache
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    times = []
    for i in range(a.output):
        sync()
        t0 = time.perf_counter()
        out = m(encoder_outputs=(enc,), decoder_input_ids=tok, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        sync()
        times.append(time.perf_counter() - t0)
print("encoder_s_per_sample,first_step_ms,median_step_ms,min_step_ms")
print(f"{te:.3f},{times[0]*1e3:.1f},{statistics.median(times[1:])*1e3:.1f},{min(times[1:])*1e3:.1f}")

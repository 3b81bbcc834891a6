"""Makes the golden files of `crates/model/tests/models/t5_hf.rs` (`transformers_t5_matches`):
a tiny T5.1.1 built by Hugging Face `transformers` with random weights, saved as safetensors with
its config, and its logits on a fixed input, so that our loader and forward pass are checked against
another implementation.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch "transformers<5" safetensors numpy

transformers 4.x: from 5.0 on, `T5Config` forces `tie_word_embeddings = True` (the LM head shares
the input embedding), which is not T5.1.1 (whose public checkpoints have their own `lm_head`).
    /tmp/venv/bin/python crates/model/tests/golden/make_t5_golden.py

Writes `t5_tiny/{config.json, model.safetensors, logits.json}` beside this script. Versions used for
the committed files are recorded in `logits.json`.
"""

import json
import pathlib

import torch
import transformers
from transformers import T5Config, T5ForConditionalGeneration

OUT = pathlib.Path(__file__).parent / "t5_tiny"

torch.manual_seed(0)
config = T5Config(
    vocab_size=100,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu",  # T5.1.1
    tie_word_embeddings=False,  # T5.1.1
    dropout_rate=0.0,
    layer_norm_epsilon=1e-6,
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
)
model = T5ForConditionalGeneration(config).eval()
# Trained-looking weights: every parameter (layer norms included) drawn N(0, 0.5).
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0.0, 0.5)

# Two inputs, the second padded (attention mask 0), and decoder inputs starting at the start token.
input_ids = torch.tensor([[5, 17, 42, 9, 63, 1], [23, 8, 77, 1, 0, 0]])
attention_mask = (input_ids != 0).long()
attention_mask[0, -1] = 1  # the first sequence's final 1 (EOS) is real
decoder_input_ids = torch.tensor([[0, 11, 3, 54], [0, 7, 29, 2]])
with torch.no_grad():
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
    ).logits

OUT.mkdir(exist_ok=True)
model.save_pretrained(OUT, safe_serialization=True)
for extra in ["generation_config.json"]:
    (OUT / extra).unlink(missing_ok=True)
(OUT / "logits.json").write_text(
    json.dumps(
        {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "input_ids": input_ids.tolist(),
            "attention_mask": attention_mask.tolist(),
            "decoder_input_ids": decoder_input_ids.tolist(),
            "logits": logits.tolist(),
        }
    )
)
print("wrote", OUT, "logits", tuple(logits.shape))

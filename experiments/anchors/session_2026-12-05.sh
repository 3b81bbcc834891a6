#!/bin/bash
# Issue 19 (after the SIMD-width fix, kept softmax probabilities, fused LayerNorm): ours (table11 --profile cpu) and both anchors in one quiet session, ours in the middle.
cd /work/main
R=experiments/anchors/raw
date -u +"jax start %FT%TZ"
../venv-jax/bin/python ../shared/anchors/flash_jax.py --steps 3 > $R/flash_jax_2026-12-05.csv || exit 1
date -u +"torch start %FT%TZ"
../venv-torch/bin/python ../shared/anchors/torch_anchor.py --steps 3 > $R/torch_anchor_2026-12-05.csv || exit 1
date -u +"table11 start %FT%TZ"
./target/release/table11 --profile cpu || exit 1
date -u +"blockwise start %FT%TZ"
../venv-jax/bin/python experiments/anchors/tfmpp_blockwise_jax.py --contexts 512,1024,2048,4096,8192 > $R/tfmpp_blockwise_jax_2026-12-05.csv || exit 1
date -u +"torch recheck start %FT%TZ"
../venv-torch/bin/python ../shared/anchors/torch_anchor.py --steps 3 --models flash,tfmpp > $R/torch_anchor_recheck_2026-12-05.csv || exit 1
date -u +"end %FT%TZ"

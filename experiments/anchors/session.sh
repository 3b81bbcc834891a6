#!/bin/bash
# Issue 19: ours (table11 --profile cpu) and both anchors in one quiet session, ours in the middle.
# usage: bash experiments/anchors/session.sh DATE   (writes experiments/anchors/raw/*_DATE.csv and
# results/table11; then `python3 experiments/anchors/session_csv.py DATE`). The 2026-12-04 and
# 2026-12-05 sessions ran these commands from dated copies (session_DATE.sh, in git history until
# this file replaced them; they differed only in the date and a `cd /work/main`).
D=${1:?usage: session.sh DATE (e.g. 2026-12-05)}
cd "$(dirname "$0")/../.."
R=experiments/anchors/raw
date -u +"jax start %FT%TZ"
../venv-jax/bin/python ../shared/anchors/flash_jax.py --steps 3 > $R/flash_jax_$D.csv || exit 1
date -u +"torch start %FT%TZ"
../venv-torch/bin/python ../shared/anchors/torch_anchor.py --steps 3 > $R/torch_anchor_$D.csv || exit 1
date -u +"table11 start %FT%TZ"
./target/release/table11 --profile cpu || exit 1
date -u +"blockwise start %FT%TZ"
../venv-jax/bin/python experiments/anchors/tfmpp_blockwise_jax.py --contexts 512,1024,2048,4096,8192 > $R/tfmpp_blockwise_jax_$D.csv || exit 1
date -u +"torch recheck start %FT%TZ"
../venv-torch/bin/python ../shared/anchors/torch_anchor.py --steps 3 --models flash,tfmpp > $R/torch_anchor_recheck_$D.csv || exit 1
date -u +"end %FT%TZ"

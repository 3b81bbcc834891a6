#!/bin/bash
# (Kept as run, from pending/fig5_rerun.sh; the paths are those of that working tree.)
# fig5 re-run at HEAD (started 2026-12-04 12:52 UTC at f73bdae's code) into a separate store
# (pending/fig5_store: untracked, so it survives a fresh checkout; checkpoints included), two
# processes split by model, then the plain command with the same store calibrates (quiet machine
# needed) and renders into pending/fig5_new. To commit: copy pending/fig5_store/<run>/{metrics.csv,
# run_config.json,env.json} over results/runs/<run> (the same names), pending/fig5_new/* into
# results/fig5, rerender README with `./target/release/fig5 --profile cpu --report`, then adapt and run
# pending/fig5_readme.py (it expects the old runs in runs/fig5_old_runs: use `git show HEAD:...`).
# The two training processes run one rayon thread each (RAYON_NUM_THREADS=1, from 15:14 UTC on
# 2026-12-04): two 2-thread pools on 2 cores oversubscribe, and runs train to the same bits at 1 or
# 2 threads (checked on FLASH-Quad, Transformer++, FLASH and the three references, 4–6 steps each).
set -e
cd "$(dirname "$0")/.."
S=pending/fig5_store
[ -f pending/fig5_start ] || date -u +%FT%TZ > pending/fig5_start
RAYON_NUM_THREADS=1 ./target/release/fig5 --profile cpu --store $S --set 'models=["flash_quad"]' --set 'one_seed_models=[]' --set 'baseline="flash_quad"' --set 'claimed_faster=[]' --set timing_rounds=0 --out pending/fig5_a >> pending/fig5_a.out 2>&1 &
RAYON_NUM_THREADS=1 ./target/release/fig5 --profile cpu --store $S --set 'models=["transformer_plusplus","flash"]' --set 'claimed_faster=["flash"]' --set timing_rounds=0 --out pending/fig5_b >> pending/fig5_b.out 2>&1 &
wait
date -u +%FT%TZ > pending/fig5_trained
./target/release/fig5 --profile cpu --store $S --out pending/fig5_new > pending/fig5_merge.out 2>&1
date -u +%FT%TZ > pending/fig5_end

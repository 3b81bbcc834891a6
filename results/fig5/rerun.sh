#!/bin/bash
# fig5 cpu at 512 + 2048 with per-model peak rates (Transformer++ 0.002, FLASH-Quad 0.004, others
# 0.003): the runs missing from results/runs trained by two one-thread workers, then the table
# rendered from the store, timed end to end. (The 2026-12-04 19:10 run of all 24 runs into a fresh
# store took 1 h 30 min 45 s; results/fig5/README.md.)
cd /work/main
date -u +%Y-%m-%dT%H:%M:%SZ > runs/fig5_final.start
/usr/bin/time -v ./target/release/fig5 --profile cpu --jobs 2 --store results/runs --out results/fig5 > runs/fig5_final.log 2>&1
echo "rc=$?" >> runs/fig5_final.log
date -u +%Y-%m-%dT%H:%M:%SZ > runs/fig5_final.end

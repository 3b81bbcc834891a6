#!/bin/bash
# fig5 cpu at 512 + 2048 with two one-thread workers into a fresh store, timed end to end.
cd /work/main
date -u +%Y-%m-%dT%H:%M:%SZ > runs/fig5_jobs.start
/usr/bin/time -v ./target/release/fig5 --profile cpu --jobs 2 --store runs/fig5_store --out runs/fig5_out > runs/fig5_jobs.log 2>&1
echo "rc=$?" >> runs/fig5_jobs.log
date -u +%Y-%m-%dT%H:%M:%SZ > runs/fig5_jobs.end

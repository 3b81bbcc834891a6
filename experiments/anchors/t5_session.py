"""The T5 side against transformers: ours (`t5_bench row NAME`) and `T5ForConditionalGeneration`
(`t5_anchor.py NAME`, PyTorch eager, tcmalloc preloaded, denormals flushed to zero as ours are),
interleaved row by row over several rounds, the order inside each row reversed every round, each
side keeping its fastest round (the rule of `session.py`, table11's session: these 2-core machines
drift by tens of percent over minutes, so both sides of a row are timed minutes apart at most).

usage: python3 experiments/anchors/t5_session.py [--rounds 2] [--rows a,b,...] [--python PATH]
                                                  [--allocator PATH | --allocator none]

Needs `cargo build --release -p model --example t5_bench` and a Python with torch and transformers
(`--python`, default `runs/venv-torch/bin/python`). Writes results/t5_transformers/: comparison.csv
(row, what it times, ours_s, transformers_s, ours_over_transformers, target, and the row's floor on
this machine: its FLOPs and bytes, floor_s, ours_over_floor, transformers_over_floor,
floor_over_transformers), comparison.md, rounds.csv (every timing of every round), ceilings.csv
(the product rate and read bandwidth `t5_bench ceiling` measures at the start of every round) and
env.json (the commit, machine, versions, date, the fastest ceilings).
"""
import argparse, csv, json, os, platform, subprocess, sys, time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "results", "t5_transformers")
BENCH = os.path.join(ROOT, "target", "release", "examples", "t5_bench")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
# The most ours / transformers a row may take (issue: "ours <= 0.7x transformers on every row").
TARGET = 0.7
ROWS = {  # name: (what it times, timed repetitions)
    "train_table1": ("training step, gqa_table1's cpu XXL stand-in (d 128, 2 + 2 layers, batch 8, 128 / 128)", 5),
    "train_d512": ("training step, d 512, 6 + 6 layers, vocabulary 32128, batch 8, 512 / 114", 3),
    "encoder_xxl": ("encoder, T5-XXL per-layer shapes, 1 layer, one input of 2048", 3),
    "decode_xxl_b1": ("MHA decoding step, T5-XXL per-layer shapes, 1 + 1 layers, input 2048, batch 1", 8),
    "decode_xxl_b8": ("MHA decoding step, same, batch 8", 8),
    "decode_xxl_b32": ("MHA decoding step, same, batch 32", 8),
}


def fail(msg):
    sys.exit(f"t5_session.py: {msg}")


def run(cmd, env=None):
    """Runs one timing command; returns the numbers of its last `NAME,x,...` line of stdout."""
    started = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        fail(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    line = [l for l in p.stdout.splitlines() if "," in l][-1]
    name, *numbers = line.split(",")
    numbers = [float(x) for x in numbers]
    print(f"  {' '.join(os.path.basename(c) for c in cmd[:2])} {name}: {numbers[0]:.4f} "
          f"({time.time() - started:.0f} s wall)", flush=True)
    return numbers


def floor_seconds(flops, nbytes, gflops, gbps):
    """A row's floor on this machine: its matrix-product FLOPs at the machine's product rate or its
    bytes at the read bandwidth, whichever takes longer (everything else counted as free)."""
    return max(flops / (gflops * 1e9), nbytes / (gbps * 1e9))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--python", default=os.path.join(ROOT, "runs", "venv-torch", "bin", "python"))
    ap.add_argument("--allocator", default=TCMALLOC)
    a = ap.parse_args()
    rows = a.rows.split(",")
    for r in rows:
        if r not in ROWS:
            fail(f"row `{r}`: not one of {', '.join(ROWS)}")
    if not os.path.exists(BENCH):
        fail(f"{BENCH} is missing: run `cargo build --release -p model --example t5_bench` first")
    if not os.path.exists(a.python):
        fail(f"{a.python} is missing: give --python a Python with torch and transformers")
    env = dict(os.environ)
    if a.allocator != "none":
        if not os.path.exists(a.allocator):
            fail(f"{a.allocator} is missing: `apt-get install libtcmalloc-minimal4`, or --allocator none")
        env["LD_PRELOAD"] = a.allocator
    costs = {}  # row: (FLOPs, bytes), as t5_bench counts them

    def ours(r):
        seconds, flops, nbytes = run([BENCH, "row", r, str(ROWS[r][1])])
        costs[r] = (flops, nbytes)
        return seconds

    theirs = lambda r: run([a.python, os.path.join(HERE, "t5_anchor.py"), r, str(ROWS[r][1])], env)[0]
    timings = []  # (round, row, side, seconds)
    ceilings = []  # (round, GFLOP/s, GB/s)
    for rnd in range(a.rounds):
        print(f"round {rnd}", flush=True)
        ceilings.append((rnd, *run([BENCH, "ceiling"])))
        for r in rows:
            sides = [("ours", ours), ("transformers", theirs)]
            for side, f in (sides if rnd % 2 == 0 else sides[::-1]):
                timings.append((rnd, r, side, f(r)))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "rounds.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "row", "side", "seconds"])
        w.writerows(timings)
    with open(os.path.join(OUT, "ceilings.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "product_gflops", "read_gbps"])
        w.writerows(ceilings)
    # The fastest round's ceilings, as each side keeps its fastest round: the floor is then the
    # lowest this session saw, so a slow round cannot make a target look out of reach.
    gflops = max(c[1] for c in ceilings)
    gbps = max(c[2] for c in ceilings)
    best = lambda r, side: min(s for (_, rr, sd, s) in timings if rr == r and sd == side)
    table = []
    for r in rows:
        o, t = best(r, "ours"), best(r, "transformers")
        floor = floor_seconds(*costs[r], gflops, gbps)
        table.append([r, ROWS[r][0], f"{o:.6f}", f"{t:.6f}", f"{o / t:.3f}", TARGET,
                      f"{costs[r][0]:.4e}", f"{costs[r][1]:.4e}", f"{floor:.6f}", f"{o / floor:.2f}",
                      f"{t / floor:.2f}", f"{floor / t:.3f}"])
    header = ["row", "what", "ours_s", "transformers_s", "ours_over_transformers", "target",
              "flops", "bytes", "floor_s", "ours_over_floor", "transformers_over_floor",
              "floor_over_transformers"]
    with open(os.path.join(OUT, "comparison.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(table)
    torch_version = subprocess.run([a.python, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
                                   capture_output=True, text=True).stdout.split()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    env_json = {
        "git_commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch_version[0] if torch_version else "unknown",
        "transformers": torch_version[1] if len(torch_version) > 1 else "unknown",
        "allocator_for_transformers": a.allocator,
        "rounds": a.rounds,
        "product_gflops": gflops,
        "read_gbps": gbps,
        "command": " ".join(sys.argv),
    }
    with open(os.path.join(OUT, "env.json"), "w") as f:
        json.dump(env_json, f, indent=2)
    with open(os.path.join(OUT, "comparison.md"), "w") as f:
        f.write(f"Seconds, each side's fastest of {a.rounds} interleaved rounds (median of the row's repetitions "
                f"within a round); {cpu}, {os.cpu_count()} cores; transformers {env_json['transformers']} on "
                f"torch {env_json['torch']} (eager, tcmalloc, denormals flushed to zero on both sides); ours at {commit[:7]}. Target: ours / transformers <= {TARGET}.\n\n"
                f"The floor is what the row would take on this machine if its matrix products ran at the machine's "
                f"product rate ({gflops:.0f} GFLOP/s, a 2048³ product through the fused path) or its bytes at the read "
                f"bandwidth ({gbps:.1f} GB/s), whichever is slower, and everything else were free (the fastest of the "
                f"rounds, `ceilings.csv`; training and encoder rows count FLOPs only). Where floor / transformers is above "
                f"the target, no implementation on this machine meets it.\n\n")
        f.write("| row | what | ours (s) | transformers (s) | ours / transformers | target met | floor (s) "
                "| ours / floor | transformers / floor | floor / transformers |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for r, what, o, t, ratio, target, _, _, floor, of, tf, ft in table:
            f.write(f"| {r} | {what} | {o} | {t} | {ratio} | {'yes' if float(ratio) <= target else 'no'} "
                    f"| {floor} | {of} | {tf} | {ft} |\n")
    table_md = open(os.path.join(OUT, "comparison.md")).read()
    fill_readme(os.path.join(OUT, "README.md"), "comparison.md", table_md)
    print(table_md)


def fill_readme(path, block, text):
    """Replaces the README's generated block (between `<!-- generated: BLOCK -->` and
    `<!-- end generated: BLOCK -->`, as `report::readme` writes them for the experiments) with
    `text`, so that the README's numbers are the session's, never retyped; a README without the
    markers is left as it is."""
    if not os.path.exists(path):
        return
    start, end = f"<!-- generated: {block} -->", f"<!-- end generated: {block} -->"
    readme = open(path).read()
    if start not in readme or end not in readme:
        return
    head, rest = readme.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{start}\n{text.rstrip()}\n{end}{tail}")


if __name__ == "__main__":
    main()

"""Issue 19's timing session: ours (`table11 --profile cpu`) and both anchors, interleaved context by
context over several rounds, so that each comparison sees the same machine state.

usage: python3 experiments/anchors/session.py DATE [--rounds 2] [--contexts 512,...,8192]
           [--allocator PATH | --allocator none] [--resume]

Why interleaved: these 2-core cloud machines drift by tens of percent over minutes (2026-12-05c: the
table ran in a slow phase, a profile 15 minutes later ran the same step 25-35% faster), so anchors
timed 10-30 minutes away from ours (the earlier `session.sh`: all of JAX, then all of PyTorch, then
ours) compared machine states as much as code. Here every context is one block (ours: the three
models, then JAX and its blockwise Transformer++, then PyTorch), the blocks run context by context,
and the next round runs them again with the order inside each block reversed. Each side of each
row keeps its fastest round: the same rule for ours and for the anchors.

Why an allocator: with glibc's malloc both anchors give their large tensors back to the kernel after
every step and fault them in again (PyTorch's FLASH at 512: 3.9 M page faults, 31 s of system time
against 43 s of user time over 5 steps; JAX's dense Transformer++ at 8192: 323 s of system time),
and what a page fault costs on these virtual machines varies several-fold over a day. PyTorch's CPU
performance guide recommends preloading tcmalloc or jemalloc; with tcmalloc both anchors ran 1.3-3.6x
faster in the probe (`raw/allocator_probe_2026-12-05d.txt`). So the anchors run with
`LD_PRELOAD` set to tcmalloc by default (`apt-get install libtcmalloc-minimal4`): the stronger
anchors, the comparison least favourable to ours. Ours links mimalloc (the experiments binaries), which keeps
its memory between steps.

Writes, under experiments/anchors/raw/: ours_DATE.csv (every `latency.csv` row of every round, with
a `round` column; ours_DATE_env.json and ours_DATE_config.json: the provenance of ours' first
run), flash_jax_DATE.csv, tfmpp_blockwise_jax_DATE.csv, torch_anchor_DATE.csv (the
anchors' rows, with `round`) and session_DATE.log (start and end of every run); and
results/table11/latency.csv (each row: ours' fastest round, copied verbatim), env.json and
config.json. Then run `python3 experiments/anchors/session_csv.py DATE`, point
`experiments/anchors/manifest.toml`'s `same_session` entries at the new files and run
`table11 --profile cpu --report`.
"""
import argparse, csv, io, json, os, shutil, subprocess, sys, tempfile, time

from session_csv import fastest_rows  # the same rule for ours as for the anchors

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HERE = os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(ROOT, "experiments", "anchors", "raw")
OUT = os.path.join(ROOT, "results", "table11")
TABLE11 = os.path.join(ROOT, "target", "release", "table11")
# The anchors' virtual environments (runs/ is not committed); VENV_JAX / VENV_TORCH name others.
VENV_JAX = os.environ.get("VENV_JAX", os.path.join(ROOT, "runs", "venv-jax", "bin", "python"))
VENV_TORCH = os.environ.get("VENV_TORCH", os.path.join(ROOT, "runs", "venv-torch", "bin", "python"))
JAX_ANCHOR = os.path.join(HERE, "flash_jax.py")
TORCH_ANCHOR = os.path.join(HERE, "torch_anchor.py")
BLOCKWISE = os.path.join(ROOT, "experiments", "anchors", "tfmpp_blockwise_jax.py")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
MODELS = ["flash", "flash_quad", "transformer_plusplus"]
ANCHOR_MODELS = ["flash", "flash_quad", "tfmpp"]  # the anchors' names
RAW_FILES = ["ours", "flash_jax", "tfmpp_blockwise_jax", "torch_anchor"]  # raw/NAME_DATE.csv


def fail(msg):
    sys.exit(f"session.py: {msg}")


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Session:
    def __init__(self, date, allocator):
        self.date = date
        self.allocator = allocator
        self.log = open(os.path.join(RAW, f"session_{date}.log"), "a")
        self.rows = {name: [] for name in RAW_FILES}
        self.headers = {}
        self.comments = {}
        self.scratch = tempfile.mkdtemp(prefix="table11_session_")

    def note(self, text):
        line = f"{now()} {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, label, cmd, env=None, killed_ok=False):
        """Runs one command; returns its stdout, or None when it was killed and `killed_ok`. Any other
        failure stops the session with the command's stderr."""
        self.note(f"start {label}: {' '.join(cmd)}")
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode == -9 and killed_ok:
            self.note(f"killed {label}")
            return None
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            fail(f"{label} exited with {done.returncode} (its stderr above); fix it and rerun")
        self.note(f"end {label}")
        return done.stdout

    def anchor(self, name, label, cmd, rnd):
        """Runs one anchor with the allocator preloaded and keeps its rows under raw/NAME_DATE.csv."""
        if self.allocator:
            text = self.run(label, cmd, dict(os.environ, LD_PRELOAD=self.allocator), killed_ok=True)
            if text is not None:
                return self.keep(name, text, rnd, "tcmalloc" if self.allocator == TCMALLOC else self.allocator)
            # Killed, as the kernel kills a process out of memory: tcmalloc keeps a process's peak
            # memory, and JAX's dense Transformer++ at 8192 tokens (1 GiB of scores per layer) ran
            # out of this machine's 24 GiB with it. Rerun with glibc's malloc; the row says so.
            self.note(f"rerun {label} with glibc's malloc (killed, out of memory, with {self.allocator})")
        self.keep(name, self.run(label, cmd), rnd, "glibc")

    def keep(self, name, text, rnd, allocator=None):
        """Appends the CSV rows of one run (comment lines kept once) with the round number and, for
        an anchor, the allocator it ran with."""
        lines = text.splitlines()
        comments = [l for l in lines if l.startswith("#")]
        body = [l for l in lines if l.strip() and not l.startswith("#")]
        if not body:
            fail(f"{name} printed no CSV rows")
        reader = csv.DictReader(io.StringIO("\n".join(body)))
        self.headers.setdefault(name, ["round"] + reader.fieldnames)
        self.comments.setdefault(name, comments)
        if allocator is not None and "allocator" not in self.headers[name]:
            self.headers[name].append("allocator")
        for row in reader:
            row["round"] = rnd
            if allocator is not None:
                row["allocator"] = allocator
            self.rows[name].append(row)
        self.write(name)

    def write(self, name):
        path = os.path.join(RAW, f"{name}_{self.date}.csv")
        with open(path + ".tmp", "w", newline="") as f:
            for c in self.comments.get(name, []):
                f.write(c + "\n")
            if self.allocator and name != "ours":
                f.write(f"# LD_PRELOAD={self.allocator}\n")
            w = csv.DictWriter(f, fieldnames=self.headers[name], lineterminator="\n")
            w.writeheader()
            w.writerows(self.rows[name])
        os.replace(path + ".tmp", path)

    def done(self, name, model, ctx, rnd):
        """Whether a resumed session already has this row."""
        return any(r["model"] == model and int(r["context"]) == ctx and int(r["round"]) == rnd
                   for r in self.rows[name])

    def resume(self):
        """Loads the rows of an interrupted session with this DATE (`--resume`)."""
        for name in self.rows:
            path = os.path.join(RAW, f"{name}_{self.date}.csv")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                lines = f.read().splitlines()
            self.comments[name] = [l for l in lines if l.startswith("#") and not l.startswith("# LD_PRELOAD=")]
            reader = csv.DictReader(l for l in lines if not l.startswith("#"))
            self.headers[name] = reader.fieldnames
            self.rows[name] = list(reader)
            self.note(f"resumed {len(self.rows[name])} rows of raw/{name}_{self.date}.csv")

    def ours(self, ctx, rnd):
        if all(self.done("ours", m, ctx, rnd) for m in MODELS):
            return
        out = os.path.join(self.scratch, f"ours_{rnd}_{ctx}")
        self.run(f"ours {ctx} round {rnd}",
                 [TABLE11, "--profile", "cpu", "--out", out, "--set", f"contexts=[{ctx}]"])
        with open(os.path.join(out, "latency.csv")) as f:
            self.keep("ours", f.read(), rnd)
        # The provenance of ours' first run (git commit, device, SIMD level, resolved config).
        for kind in ["env", "config"]:
            kept = os.path.join(RAW, f"ours_{self.date}_{kind}.json")
            if not os.path.exists(kept):
                shutil.copy(os.path.join(out, f"{kind}.json"), kept)

    # One process per model: with tcmalloc an anchor keeps its peak memory for the process's life,
    # and JAX with all three models in one process at 8192 tokens ran out of this machine's 24 GiB.
    def jax(self, ctx, rnd):
        for m in ANCHOR_MODELS:
            if not self.done("flash_jax", m, ctx, rnd):
                self.anchor("flash_jax", f"JAX {m} {ctx} round {rnd}",
                            [VENV_JAX, JAX_ANCHOR, "--steps", "3", "--models", m, "--contexts", str(ctx)], rnd)
        if not self.done("tfmpp_blockwise_jax", "transformer_plusplus_blockwise", ctx, rnd):
            self.anchor("tfmpp_blockwise_jax", f"JAX blockwise {ctx} round {rnd}",
                        [VENV_JAX, BLOCKWISE, "--anchor", JAX_ANCHOR, "--contexts", str(ctx)], rnd)

    def torch(self, ctx, rnd):
        for m in ANCHOR_MODELS:
            if not self.done("torch_anchor", m, ctx, rnd):
                self.anchor("torch_anchor", f"PyTorch {m} {ctx} round {rnd}",
                            [VENV_TORCH, TORCH_ANCHOR, "--steps", "3", "--models", m, "--contexts", str(ctx)], rnd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("date")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--contexts", default="512,1024,2048,4096,8192")
    ap.add_argument("--resume", action="store_true", help="go on with an interrupted session of this DATE")
    ap.add_argument("--allocator", default=TCMALLOC,
                    help="shared library preloaded into the anchors (default tcmalloc); 'none' for glibc's malloc")
    a = ap.parse_args()
    allocator = None if a.allocator == "none" else a.allocator
    if allocator and not os.path.exists(allocator):
        fail(f"allocator {allocator} not found: `apt-get install libtcmalloc-minimal4`, or pass --allocator none")
    for path, fix in [(TABLE11, "cargo build --release -p experiments"),
                      (VENV_JAX, "python3 -m venv runs/venv-jax && runs/venv-jax/bin/pip install jax==0.10.2 jaxlib==0.10.2"),
                      (VENV_TORCH, "python3 -m venv runs/venv-torch && runs/venv-torch/bin/pip install torch==2.9.0 "
                                   "flash-pytorch==0.1.9 x-transformers"),
                      (JAX_ANCHOR, "experiments/anchors/flash_jax.py"), (TORCH_ANCHOR, "experiments/anchors/torch_anchor.py")]:
        if not os.path.exists(path):
            fail(f"{path} not found: {fix}")
    if a.rounds < 1:
        fail("--rounds must be at least 1")
    contexts = [int(c) for c in a.contexts.split(",")]
    for name in RAW_FILES:
        if os.path.exists(os.path.join(RAW, f"{name}_{a.date}.csv")) and not a.resume:
            fail(f"raw/{name}_{a.date}.csv exists: pass --resume to go on with it, or pick a new DATE")
    s = Session(a.date, allocator)
    if a.resume:
        s.resume()
    s.note(f"session {a.date}: rounds {a.rounds}, contexts {contexts}, anchors' allocator {allocator or 'glibc'}")
    for rnd in range(1, a.rounds + 1):
        for ctx in contexts:
            # Round 1: ours, JAX, PyTorch; round 2: PyTorch, JAX, ours; and so on.
            order = [s.ours, s.jax, s.torch] if rnd % 2 == 1 else [s.torch, s.jax, s.ours]
            for side in order:
                side(ctx, rnd)
    # results/table11: ours' fastest round per row, verbatim, and the provenance of the runs.
    best = fastest_rows(s.rows["ours"])
    fields = [f for f in s.headers["ours"] if f != "round"]
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "latency.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for m in MODELS:
            for c in contexts:
                if (m, c) in best:
                    w.writerow(best[(m, c)])
    with open(os.path.join(RAW, f"ours_{a.date}_env.json")) as f:
        env = json.load(f)
    env["command"] = f"python3 experiments/anchors/session.py {' '.join(sys.argv[1:])}"
    with open(os.path.join(OUT, "env.json"), "w") as f:
        json.dump(env, f, indent=2)
        f.write("\n")
    with open(os.path.join(RAW, f"ours_{a.date}_config.json")) as f:
        config = json.load(f)
    config["contexts"] = contexts  # each run timed one context; together, these
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    shutil.rmtree(s.scratch)
    s.note(f"end of session {a.date}: wrote raw/*_{a.date}.csv and results/table11/latency.csv")


if __name__ == "__main__":
    main()

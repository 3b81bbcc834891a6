"""Builds the anchor CSVs that `table11` compares with (model,context,median_s_per_step) from the raw
outputs of one session's anchor runs, so that every number in them traces to a raw file.

usage: python3 experiments/anchors/session_csv.py DATE
  reads  experiments/anchors/raw/{flash_jax,tfmpp_blockwise_jax,torch_anchor}_DATE.csv
         (and raw/torch_anchor_recheck_DATE.csv where present)
  writes experiments/anchors/flash_jax_cpu_DATE.csv and experiments/anchors/torch_cpu_DATE.csv

JAX: `flash_jax.py`'s `tfmpp` (dense [B, H, T, T] scores) is written as
`transformer_plusplus_dense_scores`, `tfmpp_blockwise_jax.py`'s model as
`transformer_plusplus_blockwise`, and `transformer_plusplus` is the faster of the two at each context
(the best this JAX does for Transformer++). PyTorch: `torch_anchor.py`'s `tfmpp` (x-transformers,
SDPA attention) is `transformer_plusplus`; where the session re-timed some PyTorch rows
(`raw/torch_anchor_recheck_DATE.csv`), each of those rows is the faster of its two timings.
Sessions run by `session.py` (from 2026-12-05d) time every row in several rounds (a `round` column
in each raw file): each row is its fastest round, the rule `session.py` applies to ours.
"""
import csv, os, sys

NAMES = {"tfmpp": "transformer_plusplus"}


def rows(path):
    with open(path) as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]


def fastest_rows(rows):
    """(model, context) -> the row with the smallest median among its rounds, in first-seen order."""
    best = {}
    for r in rows:
        key = (r["model"], int(r["context"]))
        if key not in best or float(r["median_s_per_step"]) < float(best[key]["median_s_per_step"]):
            best[key] = r
    return best


def fastest(path):
    """(model, context) -> the smallest median over the file's rows (one per round), in file order."""
    return {k: float(r["median_s_per_step"]) for k, r in fastest_rows(rows(path)).items()}


def write(path, out):
    with open(path, "w") as f:
        f.write("model,context,median_s_per_step\n")
        for m, c, s in out:
            f.write(f"{m},{c},{s:.4f}\n")
    print("wrote", path)


def main():
    date = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    raw = lambda name: os.path.join(here, "raw", f"{name}_{date}.csv")
    jax, dense, block = [], {}, {}
    for (m, c), s in fastest(raw("flash_jax")).items():
        if m == "tfmpp":
            dense[c] = s
        else:
            jax.append((m, c, s))
    for (_, c), s in fastest(raw("tfmpp_blockwise_jax")).items():
        block[c] = s
    for c in sorted(dense):
        jax.append(("transformer_plusplus", c, min(dense[c], block.get(c, dense[c]))))
    jax += [("transformer_plusplus_dense_scores", c, s) for c, s in sorted(dense.items())]
    jax += [("transformer_plusplus_blockwise", c, s) for c, s in sorted(block.items())]
    write(os.path.join(here, f"flash_jax_cpu_{date}.csv"), jax)
    torch = [(NAMES.get(m, m), c, s) for (m, c), s in fastest(raw("torch_anchor")).items()]
    # A re-check of some rows in the same session (`torch_anchor_recheck_DATE.csv`, where present):
    # each row keeps the faster of its timings, the comparison least favourable to ours.
    if os.path.exists(raw("torch_anchor_recheck")):
        again = {(NAMES.get(r["model"], r["model"]), int(r["context"])): float(r["median_s_per_step"])
                 for r in rows(raw("torch_anchor_recheck"))}
        torch = [(m, c, min(s, again.get((m, c), s))) for m, c, s in torch]
    write(os.path.join(here, f"torch_cpu_{date}.csv"), torch)


if __name__ == "__main__":
    main()

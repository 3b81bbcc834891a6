"""Fills docs/dry-run.md's paper-cost table (between `<!-- generated: dry_run_paper.md -->` markers) from
the per-experiment summaries `just dry-run paper` wrote: one row per experiment section."""
import re
import sys

src, readme = sys.argv[1], sys.argv[2]
rows = []
title = None
for line in open(src, encoding="utf-8"):
    m = re.match(r"## (\S+) --profile \S+(.*)", line)
    if m:
        title = m.group(1)
        if "fine-tuning" in m.group(2):
            # table4 prints its pre-training sweep's plan (under that sweep's id) first.
            pre = rows[-1].split("`")[1]
            rows[-1] = rows[-1].replace(f"`{pre}`", f"`{title}` pre-training (`{pre}`'s runs)", 1)
            title += " fine-tuning"
        continue
    m = re.match(r"(\d+) runs; the largest needs (.+?) per device; ([\d.]+) PFLOPs of training in all; device-hours (.+)", line)
    if m and title:
        hours = m.group(4)
        hours = "unknown (not timed at these sizes)" if hours.startswith("unknown") else hours.rstrip(".")
        name = f"`{title.split()[0]}` fine-tuning" if title.endswith(" fine-tuning") else f"`{title}`"
        rows.append(f"| {name} | {m.group(1)} | {m.group(2)} | {float(m.group(3)):,.0f} | {hours} |")
        title = None
table = "| experiment | runs | largest per device (one device, whole batch) | training PFLOPs | device-hours |\n|---|---|---|---|---|\n" + "\n".join(rows)
text = open(readme, encoding="utf-8").read()
start, end = "<!-- generated: dry_run_paper.md -->", "<!-- end generated: dry_run_paper.md -->"
if start not in text or end not in text:
    sys.exit(f"error: {readme} has no {start} ... {end} block; add one where the table belongs")
before, rest = text.split(start, 1)
_, after = rest.split(end, 1)
open(readme, "w", encoding="utf-8").write(before + start + "\n" + table + "\n" + end + after)

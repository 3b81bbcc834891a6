#!/usr/bin/env python3
"""Writes the golden files of the metrics crate from the reference packages.

    python3 -m venv /tmp/golden && /tmp/golden/bin/pip install rouge-score==0.1.2 sacrebleu==2.6.0 nltk
    /tmp/golden/bin/python crates/metrics/tests/golden/make_golden.py

Outputs, beside this script: porter.json (word -> NLTK stem), rouge.jsonl (one pair per line with
rouge-score's precision/recall/F for plain, stemmed and T5-prepared texts), bleu.json (corpora with
sacrebleu's statistics and scores for the 13a and intl tokenizers). The Rust tests in
tests/golden.rs compare against them; nothing here is computed by our code.
"""

import json
import os
import sys

import nltk
import sacrebleu
from nltk.stem import porter
from rouge_score import rouge_scorer
from rouge_score import tokenize as rouge_tokenize

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ["rouge1", "rouge2", "rougeL", "rougeLsum"]

# Pairs chosen to exercise tokenization (case, digits, non-ASCII letters, punctuation runs),
# stemming (plurals, -ing/-ed, -ational, irregular forms), repeated n-grams (clipping), sentence
# splitting for rougeLsum (newlines, T5's " . "), and empty / token-less texts.
PAIRS = [
    ("The quick brown fox jumps over the lazy dog.\nIt was running fast.",
     "A quick brown dog jumped over the lazy foxes. It runs."),
    ("the cat sat on the mat . the dog sat on the log .",
     "the dog sat on the mat . a cat lay on the log ."),
    ("Relational databases are generously conditional; agreed happiness follows.",
     "relational database agreed generously with conditional happiness"),
    ("Skies were dying, lying and tying the innings of news.",
     "the sky dies while the news lies about innings"),
    ("Café au lait costs 3.50 EUR in 2023 — naïve pricing!",
     "cafe au lait costs 3 50 eur in 2023 naive prices"),
    ("the the the the", "the the"),
    ("a b c d e f g", "g f e d c b a"),
    ("First sentence here.\nSecond sentence there.\nThird one.",
     "Second sentence here.\nFirst sentence there."),
    ("", "something"),
    ("...!!!", "???"),
    ("Hopping, hopped, hops: the hoppers hopefully hop.",
     "hop hop hop hopeful hopper"),
    ("Controlling controllers controlled the rolling roll.",
     "control controller control rolled roll"),
    ("Electrical electricity; formalize formality; sensitivity sensibility.",
     "electric electrician formal formalism sensitive sensible"),
    ("Thou art more lovely and more temperate. Rough winds do shake the darling buds of May .",
     "Thou art lovely and temperate . Winds shake the buds of May ."),
    ("I.B.M. and A.T.&T. merged in 1999's Q4, per U.S. filings.",
     "IBM and ATT merged in 1999 Q4 per US filings"),
]

# Corpora for BLEU: a small example, multi-reference segments, length ties, no
# 4-gram matches (exp smoothing), an empty hypothesis, HTML entities and dashes for 13a, Unicode
# punctuation and symbols for intl.
BLEU_CORPORA = [
    [("The cat sat on the mat.", ["The cat is on the mat."]),
     ("Hello , world 2023.", ["Hello, world 2023."])],
    [("It is a guide to action which ensures that the military always obeys the commands of the party.",
      ["It is a guide to action that ensures that the military will forever heed Party commands.",
       "It is the guiding principle which guarantees the military forces always being under the command of the Party.",
       "It is the practical guide for the army always to heed the directions of the party."]),
     ("he read the book because he was interested in world history",
      ["he was interested in world history because he read the book"])],
    [("a b c", ["a b c d", "a b"]), ("x y z w", ["x y q w v", "x"])],
    [("one two three", ["four five six"]), ("seven eight", ["seven nine"])],
    [("", ["an empty hypothesis"]), ("short one", ["a short one indeed"])],
    [("Prices rose 3.5% &amp; fell 2-3 points &quot;today&quot; -- said the U.S. report.",
      ["Prices rose 3.5 % and fell 2 - 3 points \"today\", the U.S. report said."])],
    [("«Bonjour», dit-il — c’est l’été! Ça coûte 5€.",
      ["« Bonjour », dit-il, c’est l’été ! Ça coûte 5 €."]),
     ("数学は難しい。しかし、面白い！", ["数学は難しいが、面白い。"])],
]

# Words for the stemmer beyond those of the pairs: each rule of each step and NLTK's departures.
WORDS = """caresses ponies ties caress cats feed agreed plastered bled motoring sing conflated
troubled sized hopping tanned falling hissing fizzed failing filing happy sky enjoy spy fly try
relational conditional rational valenci hesitanci digitizer conformabli radicalli differentli
vileli analogousli vietnamization predication operator feudalism decisiveness hopefulness
callousness formaliti sensitiviti sensibiliti triplicate formative formalize electriciti
electrical hopeful goodness revival allowance inference airliner gyroscopic adjustable
defensible irritant replacement adjustment dependent adoption homologou communism activate
angulariti homologous effective bowdlerize probate rate cease controll roll generously dies
spied died flies dying lying tying news innings outings cannings howe proceed exceed succeed
geology theology archaeology philology fully beautifully hopefully ie is a oed
""".split()


def rouge_rows():
    scorers = {
        "plain": rouge_scorer.RougeScorer(KEYS, use_stemmer=False),
        "stem": rouge_scorer.RougeScorer(KEYS, use_stemmer=True),
    }
    for target, prediction in PAIRS:
        row = {"target": target, "prediction": prediction}
        for name, scorer in scorers.items():
            s = scorer.score(target, prediction)
            row[name] = {k: [s[k].precision, s[k].recall, s[k].fmeasure] for k in KEYS}
        # T5's _prepare_summary (t5.evaluation.metrics.rouge), unstemmed.
        t5 = scorers["plain"].score(target.replace(" . ", " .\n"), prediction.replace(" . ", " .\n"))
        row["t5"] = {k: [t5[k].precision, t5[k].recall, t5[k].fmeasure] for k in KEYS}
        yield row


def bleu_rows():
    for corpus in BLEU_CORPORA:
        hyps = [h for h, _ in corpus]
        n_refs = max(len(r) for _, r in corpus)
        # sacrebleu takes reference streams; pad with None where a segment has fewer references.
        streams = [[r[i] if i < len(r) else None for _, r in corpus] for i in range(n_refs)]
        row = {"segments": [{"hypothesis": h, "references": r} for h, r in corpus]}
        for tok in ["13a", "intl"]:
            s = sacrebleu.corpus_bleu(hyps, streams, tokenize=tok)
            row[tok] = {"bleu": s.score, "counts": list(s.counts), "totals": list(s.totals),
                        "sys_len": s.sys_len, "ref_len": s.ref_len, "precisions": list(s.precisions),
                        "bp": s.bp}
        yield row


def main():
    stemmer = porter.PorterStemmer()
    words = set(WORDS)
    for target, prediction in PAIRS:
        words.update(rouge_tokenize.tokenize(target, None))
        words.update(rouge_tokenize.tokenize(prediction, None))
    with open(os.path.join(HERE, "porter.json"), "w") as f:
        json.dump({w: stemmer.stem(w) for w in sorted(words)}, f, indent=0, sort_keys=True)
    with open(os.path.join(HERE, "rouge.jsonl"), "w") as f:
        for row in rouge_rows():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(HERE, "bleu.json"), "w") as f:
        json.dump(list(bleu_rows()), f, ensure_ascii=False, indent=1)
    with open(os.path.join(HERE, "VERSIONS"), "w") as f:
        f.write(f"python {sys.version.split()[0]}\nnltk {nltk.__version__}\n"
                f"sacrebleu {sacrebleu.__version__}\nrouge-score 0.1.2\n")


if __name__ == "__main__":
    main()

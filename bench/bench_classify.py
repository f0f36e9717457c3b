"""Classifier throughput: verdicts per CPU second on one core over the mixed failure corpus (target >= 10,000/s).

Side by side in one run (ratios survive a noisy machine):

- typical:   every corpus case as written (tens of log lines, error files, NVML records, Xids)
- long:      the same cases with each log tail grown to 64 KiB of ordinary progress lines in front
             (only the last ``max_tail_chars`` are scanned, so this shows the bound holding)
- medium:    each log tail grown to 4 KiB (about 40 lines, an epilog-sized tail)
- reference: the typical cases with every regex run on every line (what the anchored scan avoids)

Rates are verdicts per CPU second of this single-threaded process, so other load on the machine does not
count against them (cache contention still does).

Usage: python bench/bench_classify.py [--seconds S] [--json] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_ft.bench.classify_bench import _rate, load_corpus, mismatches, run  # noqa: E402
from slurm_ft.classify import classify, default_rules  # noqa: E402

TARGET = 10_000
PROGRESS = "[rank{r}]: step {s} | loss 2.{s:04d} | lr 2.9e-04 | grad_norm 0.98 | 412k tok/s | mem 71.2 GiB\n"


def _padded(evidence, size: int):
    logs = []
    for tail in evidence.logs:
        lines, n = [], 0
        while n < size:
            line = PROGRESS.format(r=tail.rank or 0, s=len(lines))
            lines.append(line)
            n += len(line)
        logs.append(dataclasses.replace(tail, text="".join(lines) + tail.text))
    return dataclasses.replace(evidence, logs=tuple(logs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement (default 3)")
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "data" / "corpus")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be > 0")
    rules = default_rules()
    result = run(args.corpus, seconds=args.seconds, rules=rules)
    cases = load_corpus(args.corpus)
    medium_evidence = [_padded(c.evidence, 4 * 1024) for c in cases]
    result["medium_tail_verdicts_per_s"] = round(_rate(lambda ev: classify(ev, rules), medium_evidence,
                                                       args.seconds / 2)[0])
    long_evidence = [_padded(c.evidence, 64 * 1024) for c in cases]
    result["long_tail_verdicts_per_s"] = round(_rate(lambda ev: classify(ev, rules), long_evidence,
                                                     args.seconds / 2)[0])
    result["long_tail_mismatching_cases"] = [c.name for c, ev in zip(cases, long_evidence)
                                             if mismatches(c, classify(ev, rules).to_dict())]
    result["target_verdicts_per_s"] = TARGET
    if args.json:
        print(json.dumps(result))
    else:
        print(f"corpus: {result['cases']} cases, {result['mean_text_chars']} chars of log/error text "
              "per case on average")
        print(f"typical    {result['verdicts_per_s']:>9,} verdicts/s   (target {TARGET:,}: "
              f"{'met' if result['verdicts_per_s'] >= TARGET else 'NOT met'})")
        print(f"medium     {result['medium_tail_verdicts_per_s']:>9,} verdicts/s   (4 KiB log tails)")
        print(f"long tail  {result['long_tail_verdicts_per_s']:>9,} verdicts/s   (64 KiB logs, scan bounded to "
              f"{rules.limits.max_tail_chars // 1024} KiB)")
        print(f"reference  {result['reference_verdicts_per_s']:>9,} verdicts/s   (every regex on every line; "
              f"anchored scan is {result['speedup']}x faster)")
        wrong = result["mismatching_cases"] + result["long_tail_mismatching_cases"]
        print("all verdicts as expected" if not wrong else f"UNEXPECTED verdicts: {wrong}")
    return 0 if not (result["mismatching_cases"] or result["long_tail_mismatching_cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())

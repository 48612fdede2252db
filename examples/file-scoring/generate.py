#!/usr/bin/env python3
"""Generate the file-scoring example's input: small text files of varying length.

Deterministic (seeded), so two runs produce the same files and the same scores.
"""
import argparse
import os
import random

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega").split()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(here, "data"), help="folder to write into")
    parser.add_argument("--count", type=int, default=2000, help="number of files")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    for i in range(args.count):
        # Two levels of folders, so listing order and nested keys are exercised too.
        folder = os.path.join(args.out, f"shard-{i % 4}")
        os.makedirs(folder, exist_ok=True)
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 40))]
        with open(os.path.join(folder, f"doc-{i:05d}.txt"), "w", encoding="utf-8") as f:
            f.write(" ".join(words) + "\n")
    print(f"wrote {args.count} files under {args.out}")


if __name__ == "__main__":
    main()

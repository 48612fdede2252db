"""File-scoring entry script: Azure ML parallel job contract (init / run / shutdown).

Scores each text file by counting its words; returns one row per input file. Uses only the
standard library, so it runs on any Python 3.
"""
import argparse
import os

long_threshold = None


def init():
    """Called once per worker process: parse our own arguments, load the "model"."""
    global long_threshold
    parser = argparse.ArgumentParser()
    parser.add_argument("--long_threshold", type=int, default=20)
    args, _unknown = parser.parse_known_args()
    long_threshold = args.long_threshold
    print(f"init: long_threshold={long_threshold}")  # goes to the user log, not the protocol


def run(mini_batch):
    """Score one mini-batch: a list of local file paths. One result row per file."""
    rows = []
    for path in mini_batch:
        with open(path, encoding="utf-8") as f:
            words = len(f.read().split())
        label = "long" if words > long_threshold else "short"
        rows.append(f"{os.path.basename(path)} {words} {label}")
    return rows


def shutdown():
    print("shutdown: done")

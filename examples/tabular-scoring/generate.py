#!/usr/bin/env python3
"""Generate the tabular-scoring example's input: one CSV of orders and its MLTable file.

Deterministic (seeded). Some fields are quoted and hold commas ("Smith, Jane"), some names are
not ASCII, so splitting the file into byte ranges is exercised on more than plain lines.
"""
import argparse
import csv
import os
import random

FIRST = ["Jane", "Omar", "Zoë", "Łukasz", "Mei", "José", "Ana", "Kwame", "Ines", "Ravi"]
LAST = ["Smith", "García", "Müller", "Nakamura", "Okafor", "Dubois", "Kowalski", "Rossi"]
CITIES = ["Paris", "São Paulo", "Zürich", "Lagos", "Osaka", "Austin, TX", "Kraków"]

MLTABLE = """\
# Azure ML MLTable: one CSV file, read with a header line.
type: mltable
paths:
  - file: ./orders.csv
transformations:
  - read_delimited:
      delimiter: ","
      encoding: utf8
      header: all_files_same_headers
      empty_as_string: false
"""


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(here, "data"), help="folder to write into")
    parser.add_argument("--rows", type=int, default=60000)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "orders.csv"), "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["order_id", "customer", "city", "quantity", "unit_price", "note"])
        for i in range(args.rows):
            customer = f"{rng.choice(LAST)}, {rng.choice(FIRST)}"  # quoted: holds a comma
            note = "" if rng.random() < 0.2 else rng.choice(["gift", "express, insured", "pick-up"])
            writer.writerow([i, customer, rng.choice(CITIES), rng.randint(1, 20),
                             f"{rng.uniform(0.5, 200):.2f}", note])
    with open(os.path.join(args.out, "MLTable"), "w", encoding="utf-8") as f:
        f.write(MLTABLE)


if __name__ == "__main__":
    main()

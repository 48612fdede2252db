#!/usr/bin/env python3
"""Generate the many-models example's input: weekly sales laid out as <Store>/<Brand>/data.csv.

6 stores x 5 brands = 30 partitions, each with its own number of weeks (so every partition's row
count differs) and its own price sensitivity, plus the MLTable that reads them and takes
`Store` and `Brand` from the paths. Deterministic (seeded).
"""
import argparse
import csv
import os
import random

STORES = ["Store1001", "Store1002", "Store1003", "Store1004", "Store1005", "Store1006"]
BRANDS = ["dominicks", "minute.maid", "tropicana", "florida-natural", "private"]

MLTABLE = """\
# Azure ML MLTable: every <Store>/<Brand>/data.csv, with Store and Brand columns from the path.
type: mltable
paths:
  - pattern: ./*/*/data.csv
transformations:
  - read_delimited:
      delimiter: ","
      header: all_files_same_headers
  - extract_columns_from_partition_format: "{Store}/{Brand}/data.csv"
"""


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(here, "data"), help="folder to write into")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    for store in STORES:
        for brand in BRANDS:
            folder = os.path.join(args.out, store, brand)
            os.makedirs(folder, exist_ok=True)
            base, slope = rng.uniform(8000, 20000), -rng.uniform(500, 3000)
            with open(os.path.join(folder, "data.csv"), "w", encoding="utf-8", newline="") as f:
                writer = csv.writer(f, lineterminator="\n")
                writer.writerow(["week", "price", "quantity"])
                for week in range(rng.randint(40, 120)):
                    price = round(rng.uniform(1.5, 4.0), 2)
                    quantity = max(0, round(base + slope * price + rng.gauss(0, 300)))
                    writer.writerow([week, price, quantity])
    with open(os.path.join(args.out, "MLTable"), "w", encoding="utf-8") as f:
        f.write(MLTABLE)


if __name__ == "__main__":
    main()

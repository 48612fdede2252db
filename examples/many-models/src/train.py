"""Many models: fit one tiny model per (Store, Brand) partition.

`run()` gets one partition's rows as a pandas DataFrame (its Store and Brand columns come from
the file paths) and `mini_batch_context.partition_key_value` names the partition. The model, a
least-squares line quantity = a + b * price in plain Python, is written as JSON under the job's
output folder (AZUREML_BI_OUTPUT_PATH), one file per partition. Nothing is appended to the
job's output file: run() returns [].
"""
import json
import os

output_folder = None


def init():
    global output_folder
    output_folder = os.environ["AZUREML_BI_OUTPUT_PATH"]


def fit_line(xs, ys):
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return mean_y - slope * mean_x, slope


def run(mini_batch, mini_batch_context):
    key = mini_batch_context.partition_key_value
    intercept, slope = fit_line(list(mini_batch["price"]), list(mini_batch["quantity"]))
    model = {
        "store": key["Store"],
        "brand": key["Brand"],
        "rows": len(mini_batch),
        "weeks": sorted(int(w) for w in mini_batch["week"]),
        "stores_seen": sorted(set(mini_batch["Store"])),
        "brands_seen": sorted(set(mini_batch["Brand"])),
        "intercept": intercept,
        "slope": slope,
    }
    folder = os.path.join(output_folder, key["Store"], key["Brand"])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.json"), "w", encoding="utf-8") as f:
        json.dump(model, f)
    return []

"""Score orders: one output row per input row (order id, total, a risk flag).

`run()` gets a pandas DataFrame of the mini-batch's rows (a 256 KiB range of orders.csv) and
returns a DataFrame; batchfleet appends its rows to the job's output file.
"""
import pandas as pd

big_order = None


def init():
    global big_order
    big_order = 500.0


def run(mini_batch):
    total = (mini_batch["quantity"] * mini_batch["unit_price"]).round(2)
    return pd.DataFrame({
        "order_id": mini_batch["order_id"],
        "total": total,
        "review": (total > big_order).map({True: "review", False: "ok"}),
    })

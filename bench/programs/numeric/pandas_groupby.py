"""pandas: build a frame, group by one and two keys, aggregate, merge and sort."""

import numpy as np
import pandas as pd


def bench():
    n = 300_000
    ids = np.arange(n)
    frame = pd.DataFrame(
        {
            "store": ids % 50,
            "product": (ids * 31) % 200,
            "units": (ids % 7) + 1,
            "price": ((ids * 13) % 1000) / 10.0,
        }
    )
    frame["revenue"] = frame["units"] * frame["price"]
    by_store = frame.groupby("store").agg(units=("units", "sum"), revenue=("revenue", "sum"))
    by_pair = frame.groupby(["store", "product"])["revenue"].mean()
    stores = pd.DataFrame({"store": range(50), "region": [f"r{i % 5}" for i in range(50)]})
    merged = frame.merge(stores, on="store")
    by_region = merged.groupby("region")["revenue"].sum().sort_values(ascending=False)
    assert len(by_store) == 50 and int(by_store["units"].sum()) == int(frame["units"].sum())
    assert abs(by_region.sum() - frame["revenue"].sum()) < 1e-6 * frame["revenue"].sum()
    assert len(by_pair) == len(frame[["store", "product"]].drop_duplicates())
    assert int(frame["units"].sum()) == 1_199_997  # 42857 weeks of 1..7, plus 1

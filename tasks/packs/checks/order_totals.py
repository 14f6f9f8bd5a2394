"""Checker of the order-totals pack: totals.json must give every city of the instance's
orders the total qty of the item named by the pack. sys.argv[1] is the episode's answer, then
the item and the quantities a, b, c, d the pack drew: the orders are rebuilt from those, not
read from the workspace, whose orders.csv the policy could have changed."""
import json
import sys

item = sys.argv[2]
a, b, c, d = (int(x) for x in sys.argv[3:7])
# The rows of the pack's orders.csv, in order.
orders = [
    ("Oslo", "apples", a),
    ("Lima", "pears", b),
    ("Oslo", "pears", c),
    ("Lima", "apples", d),
    ("Quito", "plums", a),
    ("Oslo", "plums", b),
]
want = {}
for city, what, qty in orders:
    want.setdefault(city, 0)
    if what == item:
        want[city] += qty
try:
    with open("totals.json") as f:
        got = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"totals.json is missing or not JSON: {e}")
if got != want:
    sys.exit(f"totals.json holds {got}, expected {want}")

import json
import sys

data = json.load(sys.stdin)
assert data["items"], "no items"
print("ok:", len(data["items"]), "items")

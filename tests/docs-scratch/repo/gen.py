import json

print(json.dumps({"version": 2, "items": [1, 2, 3]}))

import json
import sys

new = json.load(sys.stdin)
with open("VERSION", "w") as f:
    f.write(f"{new['version']}\n")
print("applied version", new["version"])

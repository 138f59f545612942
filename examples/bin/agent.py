"""Stand-in for a coding agent working on one scope: `agent.py SCOPE [FILE]` writes
SCOPE/FILE (default: SCOPE/main.txt)."""
import os
import sys

scope = sys.argv[1]
name = sys.argv[2] if len(sys.argv) > 2 else "main.txt"
path = os.path.normpath(os.path.join(scope, name))
os.makedirs(scope, exist_ok=True)
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    f.write(f"written by the {scope} agent\n")
print(f"{scope}: done")

"""Stand-in editor: applies the unified diff on stdin to the files of the workspace (a tiny
subset of `patch`: one hunk per file, context and added lines)."""
import sys

lines = sys.stdin.read().splitlines()
path, out = None, []
for line in lines:
    if line.startswith("+++ "):
        path = line[4:].split("/", 1)[1]
    elif line.startswith("--- ") or line.startswith("@@"):
        continue
    elif path and line[:1] in (" ", "+"):
        out.append(line[1:])
if path is None:
    sys.exit("no patch on stdin")
with open(path, "w") as f:
    f.write("\n".join(out) + "\n")
print(f"patched {path}", file=sys.stderr)

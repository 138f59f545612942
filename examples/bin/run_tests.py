"""Stand-in for `pytest -x`: imports the workspace's module and checks it."""
import sys

sys.path.insert(0, ".")
import calc  # noqa: E402

assert calc.add(2, 3) == 5
if hasattr(calc, "mul"):
    assert calc.mul(2, 3) == 6, "mul is wrong"
print("tests passed")

"""The ``lockbox`` command that ``pip install ./python`` puts on ``PATH``: the same CLI as
``cargo install --path crates/lockbox-cli``, linked into the extension module."""

from __future__ import annotations

import sys

from . import _lockbox


def main() -> None:
    """Runs ``lockbox`` with this process's arguments; never returns."""
    _lockbox.cli_main(sys.argv)


if __name__ == "__main__":
    main()

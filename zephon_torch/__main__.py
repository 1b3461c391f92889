"""``python -m zephon_torch``: the ``zephon-torch`` command line."""

from zephon_torch.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m core.cli``: the ``ragscope`` command."""

from core.cli.dispatch import main

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m exgrpo.inspect_pool``: kept for the command users type; the tool is :mod:`exgrpo.tools.inspect_pool`."""

from exgrpo.tools.inspect_pool import main

if __name__ == "__main__":
    raise SystemExit(main())

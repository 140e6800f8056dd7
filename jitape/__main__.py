"""`python -m jitape`: the same command line as the `jitape` script."""

from jitape.cli import main

if __name__ == "__main__":      # not in the worker processes `jitape warmup` spawns, which import this module
    raise SystemExit(main())

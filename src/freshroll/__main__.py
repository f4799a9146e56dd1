"""``python -m freshroll``: the same command line as ``freshroll``."""

from freshroll.cli import main

if __name__ == "__main__":
    main()

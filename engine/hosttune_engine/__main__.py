"""`python -m hosttune_engine serve --model PATH ...` (the same as `hosttune-engine`)."""

from hosttune_engine.server.cli import main

if __name__ == "__main__":
    main()

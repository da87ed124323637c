"""The engine's benchmarks on one GPU: scripts (`python benchmarks/engine/NAME.py`) and the helpers they share;
the tests import their measuring code and run it on tiny CPU shapes."""

"""The engine's benchmarks on one GPU: each module is a script (`python benchmarks/engine/NAME.py`) whose
measuring code the tests import on tiny CPU shapes."""

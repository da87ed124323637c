"""Build engine wheels: the bundled engine from engine/, vLLM and SGLang from source at a pinned ref.

archs.py (which CUDA architectures), toolchain.py (what the build machine has), source.py
(which commit), plan.py (the commands, as data), runner.py (the one place that runs them),
archcheck.py (machine code for every architecture), wheelhouse.py (the cache), builder.py
(the order of it all).
"""

"""A scripted OpenAI-compatible server whose timings are known exactly: the target of the
bench tests, the deploy canary test and the client benchmarks. It is test support, not part
of the shipped package, and imports only the standard library.

- server.py   the server: slots, a FIFO queue, scripted first-token and inter-token delays
- stream.py   one response on the wire, each token written from a timer at its deadline
- cache.py    its prefix cache and its vLLM-named /metrics
- launch.py   start it in its own process and read the URL it listens on
"""

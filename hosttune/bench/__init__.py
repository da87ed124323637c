"""`hosttune bench`: production-shaped load against OpenAI-compatible endpoints.

One noun per module, in the order a run uses them:

- distributions.py  prompt and output length distributions, from spec strings
- prompts.py        prompts of an exact token count (target /tokenize or tokenizer.json)
- connection.py     HTTP/1.1 keep-alive connections that timestamp bytes on arrival
- sse.py            the OpenAI server-sent event stream, parsed as it arrives
- client.py         one streaming request -> StreamResult
- loadgen.py        closed-loop users or open-loop arrivals, warm-up, drain, lag probe
- record.py         RequestRecord / RunRecord: what a run recorded
- benchmark.py      BenchSpec and measure(): one run against one endpoint
- metrics.py        pure statistics over records, with their definitions
- sweep.py          the highest rate that meets the SLO
- report.py, plot.py, console.py, units.py   JSON/Markdown, PNGs, terminal text, parsing
- testserver.py, scripted_stream.py          a scripted server with known timings (tests)
"""

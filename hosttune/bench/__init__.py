"""`hosttune bench`: production-shaped load against OpenAI-compatible endpoints.

One noun per module, in the order a run uses them:

- distributions.py  prompt and output length distributions, from spec strings
- prompts.py        prompts of an exact token count (target /tokenize or tokenizer.json)
- workload.py       what each request says: random words, shared system prompts, conversations
- dataset.py, trace.py   prompts from ShareGPT/JSONL files; arrival times and lengths to replay
- connection.py     HTTP/1.1 keep-alive connections that timestamp bytes on arrival
- sse.py            the OpenAI server-sent event stream, parsed as it arrives
- client.py         one streaming request -> StreamResult
- loadgen.py        closed-loop users, open-loop arrivals or a trace, warm-up, drain, lag probe
- server_metrics.py the server's /metrics (vLLM names) sampled through a run
- record.py         RequestRecord / RunRecord: what a run recorded
- benchmark.py      BenchSpec and measure(): one run against one endpoint
- metrics.py        pure statistics over records, with their definitions
- sweep.py          the highest rate that meets the SLO
- report.py, report_csv.py, plot.py, console.py, units.py   JSON/Markdown, CSV, PNGs, terminal text, parsing
"""

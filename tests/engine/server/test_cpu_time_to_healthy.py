"""A real 135M-parameter model (SmolLM2) at its full context of 8192 becomes healthy on
CPU within a minute, warmup and the step-cost measurement included, and then serves."""

import time

from .harness import ServerProcess, get_json, post

HEALTHY_WITHIN_S = 60


def test_smollm2_at_full_context_is_healthy_within_a_minute(smollm2, tmp_path):
    folder = smollm2
    started = time.monotonic()
    # fp32 keys and values of 8192 tokens take 0.35 GiB; the default 0.25 GiB pool is refused at this context
    server = ServerProcess(folder, tmp_path, ["--served-model-name", "smollm2", "--cpu-kv-cache-gib", "0.5"])
    try:
        server.wait_ready(timeout=HEALTHY_WITHIN_S + 30)
        seconds = time.monotonic() - started
        print(f"SmolLM2-135M on CPU: healthy {seconds:.1f} s after start")
        print("\n".join(line for line in server.log().splitlines() if "step budget" in line or "warmup done" in line))
        log = server.log()
        # the step costs are timed after warmup, when nothing is left to compile, before /health says 200
        assert log.index("warmup done") < log.index("step budget auto") < log.index("step costs measured")
        _, models = get_json(server.url + "/v1/models")
        assert models["data"][0]["max_model_len"] == 8192
        assert seconds <= HEALTHY_WITHIN_S, server.log()
        status, _, body = post(server.url + "/v1/completions", {
            "model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert status == 200 and b'"completion_tokens":4' in body.replace(b" ", b"")
    finally:
        server.terminate()

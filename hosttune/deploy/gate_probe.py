# Runs ON THE HOST with its system python3 (standard library only), sent as `python3 -c`.
# Waits for the service to be healthy, sends warmup requests, then the gate: one real
# one-token generation within a deadline. Prints one JSON line; never changes anything.
# argv[1]: JSON {unit, port, health_path, health_timeout_s, warmup, gate_timeout_s, restarts_baseline, key_file}
# key_file: the service's EnvironmentFile holding its API key (NAME=KEY), read here so the key is
# never in this script's arguments; requests then carry `Authorization: Bearer KEY`.
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

WARMUP_PROMPTS = ("Hello", "The capital of France is", "Write one word about GPUs:", "1 2 3 4 5 6 7 8")


def unit_state(unit):
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts",
                          "-p", "MainPID"], capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


HEADERS = {"Content-Type": "application/json"}


def read_key(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, sep, value = line.strip().partition("=")
            if sep and value and not name.startswith("#"):
                return value.strip().strip("'\"")
    raise RuntimeError(f"{path} holds no KEY=VALUE line")


def request(url, body=None, timeout=10.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=HEADERS)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def wait_healthy(args, base, start):
    """Seconds until /health said 200; raises when the unit stopped or restarted, or the deadline passed."""
    # A manual (re)start resets NRestarts to 0: after activation any restart is the new release crashing.
    baseline = args["restarts_baseline"]
    if baseline is None:
        baseline = int(unit_state(args["unit"]).get("NRestarts") or 0)
    while True:
        state = unit_state(args["unit"])
        if int(state.get("NRestarts") or 0) > baseline or state.get("SubState") == "auto-restart":
            raise RuntimeError(f"the service exited and systemd is restarting it (restarts: {state.get('NRestarts')})")
        if state.get("ActiveState") in ("failed", "inactive"):
            raise RuntimeError(f"the service is {state.get('ActiveState')} ({state.get('SubState')})")
        try:
            status, _ = request(base + args["health_path"], timeout=2.0)
            if status == 200:
                return time.monotonic() - start
        except (OSError, ValueError):
            pass  # not listening yet
        if time.monotonic() - start > args["health_timeout_s"]:
            raise RuntimeError(f"not healthy after {args['health_timeout_s']:.0f}s")
        time.sleep(0.5)


def completion(base, model, prompt, max_tokens, timeout):
    t0 = time.monotonic()
    status, text = request(base + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0}, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"/v1/completions answered {status}: {text[:300]}")
    doc = json.loads(text)
    if not doc.get("choices"):
        raise RuntimeError(f"/v1/completions returned no choices: {text[:300]}")
    return doc, time.monotonic() - t0


def main():
    args = json.loads(sys.argv[1])
    base = f"http://127.0.0.1:{args['port']}"
    result = {"ok": False, "phase": "health"}
    start = time.monotonic()
    try:
        if args.get("key_file"):
            HEADERS["Authorization"] = "Bearer " + read_key(args["key_file"])
        result["health_s"] = round(wait_healthy(args, base, start), 2)
        result["phase"] = "models"
        status, text = request(base + "/v1/models")
        models = json.loads(text).get("data", []) if status == 200 else []
        if not models:
            raise RuntimeError(f"/v1/models answered {status} with no model: {text[:300]}")
        result["model"] = model = models[0]["id"]
        result["phase"] = "warmup"
        t0 = time.monotonic()
        for i in range(args["warmup"]):
            completion(base, model, WARMUP_PROMPTS[i % len(WARMUP_PROMPTS)], 8, args["gate_timeout_s"])
        result["warmup"] = {"requests": args["warmup"], "s": round(time.monotonic() - t0, 2)}
        result["phase"] = "gate"
        doc, seconds = completion(base, model, "Hello", 1, args["gate_timeout_s"])
        tokens = (doc.get("usage") or {}).get("completion_tokens")
        if tokens is not None and tokens != 1:
            raise RuntimeError(f"asked for one token, got {tokens}")
        if seconds > args["gate_timeout_s"]:
            raise RuntimeError(f"the one-token generation took {seconds:.1f}s (deadline {args['gate_timeout_s']}s)")
        result.update(ok=True, phase="done", gate_s=round(seconds, 3), text=doc["choices"][0].get("text", ""))
    except Exception as exc:  # everything becomes the JSON answer: the caller decides
        result["error"] = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc)
    print(json.dumps(result))


main()

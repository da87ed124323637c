# Runs ON THE HOST with its system python3 (standard library only), from the release folder as
# `python3 replica_lb.py COMMAND [INDEX]`, beside the replicas.json deploy wrote there.
# Keeps the host-local nginx upstream in step with the replicas: a replica is "down" in nginx while
# deploy drains it (out/in) or while it fails the generation probe (probe), and serving otherwise.
# With a router (replicas.json names its URL) the replicas are the router's workers instead: one
# that is out is removed from it (its requests in flight finish), one that is in and answers its
# health check is added; nginx sends everything to the router and is not reloaded.
#   sync         write the servers file from the markers and reload nginx (or the router's workers)
#   out INDEX... drain: take the replicas out of nginx (deploy, before it restarts them, or new ones until their gate)
#   in INDEX...  put them back (deploy, after their gate passed)
#   probe        one one-token generation per replica; failing ones out, recovered ones back in
#                (with the replicas' API key, read from their key file by host_key.py, sent in front)
# Prints one JSON line.
import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# Says to the deploy that runs a release's copy of this script that `out` and `in` take several replicas: the copies
# older hosttune versions installed mark only the first, and are given one replica a call (rolling.lb_ops).
TAKES_SEVERAL = True
HERE = os.path.dirname(os.path.abspath(__file__))
SETTLE_S = 1.0  # after a reload, for nginx's new workers to take over from the old ones
ROUTER_WAIT_S = 60.0  # for a router that is starting to answer


def load():
    with open(os.path.join(HERE, "replicas.json"), encoding="utf-8") as f:
        return json.load(f)


def marker(conf, kind, index):
    return os.path.join(conf["state_dir"], f"{kind}-{index}")


def is_marked(conf, kind, index):
    return os.path.exists(marker(conf, kind, index))


def mark(conf, kind, index, on):
    path = marker(conf, kind, index)
    if on:
        open(path, "w").close()
    elif os.path.exists(path):
        os.unlink(path)


def servers_text(conf):
    lines = ["# Managed by hosttune (replica_lb.py): the replicas of this host; down = drained or failing its probe."]
    for r in conf["replicas"]:
        down = not is_in(conf, r["index"])
        lines.append(f"server 127.0.0.1:{r['port']} max_fails={conf['max_fails']} "
                     f"fail_timeout={conf['fail_timeout_s']}s{' down' if down else ''};")
    return "\n".join(lines) + "\n"


def run(argv):
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {(result.stderr or result.stdout).strip()[-400:]}")


def put(path, text):
    """The file whole or not at all (None: removed)."""
    if text is None:
        if os.path.exists(path):
            os.unlink(path)
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def sync(conf):
    """Write the servers file (atomically) and have nginx load it; unchanged text changes nothing. nginx -t judges
    the new file in place: refused, the one before comes back (or none), so the next reload of nginx still loads."""
    path, text, before = conf["servers_file"], servers_text(conf), None
    try:
        with open(path, encoding="utf-8") as f:
            before = f.read()
        if before == text and nginx_active():
            return False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    put(path, text)
    try:
        run(["nginx", "-t", "-q"])
    except RuntimeError:
        put(path, before)
        raise
    run(["systemctl", "reload-or-restart", "nginx.service"])
    time.sleep(SETTLE_S)
    return True


def is_in(conf, index):
    return not (is_marked(conf, "drained", index) or is_marked(conf, "failed", index))


def replica_url(replica):
    return f"http://127.0.0.1:{replica['port']}"


def router_call(conf, method, path, timeout=30.0):
    req = urllib.request.Request(conf["router"] + path, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


def router_workers(conf):
    """The router's workers; a router that is starting gets ROUTER_WAIT_S to answer."""
    deadline = time.monotonic() + ROUTER_WAIT_S
    while True:
        try:
            return set(json.loads(router_call(conf, "GET", "/list_workers"))["urls"])
        except (OSError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def is_healthy(conf, replica):
    """The router waits for a worker it adds to become healthy: only a replica that already is gets added."""
    try:
        with urllib.request.urlopen(replica_url(replica) + conf.get("health", "/health"), timeout=5) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def sync_router(conf):
    """Out replicas (and ports no replica has) removed from the router; in and healthy ones added."""
    have = router_workers(conf)
    wanted = {replica_url(r): r for r in conf["replicas"] if is_in(conf, r["index"])}
    gone = sorted(have - set(wanted))
    new = [url for url, r in sorted(wanted.items()) if url not in have and is_healthy(conf, r)]
    for verb, urls in (("remove_worker", gone), ("add_worker", new)):
        for url in urls:
            router_call(conf, "POST", f"/{verb}?url={urllib.parse.quote(url, safe='')}")
    return bool(gone or new)


def nginx_active():
    return subprocess.run(["systemctl", "is-active", "--quiet", "nginx.service"]).returncode == 0


def request(url, headers, body=None, timeout=10.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8", "replace"))


def generates(port, headers, timeout):
    """One real one-token generation on the replica, or why not."""
    base = f"http://127.0.0.1:{port}"
    try:
        model = request(base + "/v1/models", headers, timeout=timeout)["data"][0]["id"]
        doc = request(base + "/v1/completions", headers,
                      {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}, timeout=timeout)
        return "" if doc.get("choices") else "no choices in the answer"
    except (OSError, ValueError, KeyError, IndexError, urllib.error.URLError) as exc:
        return f"{type(exc).__name__}: {exc}"


def probe(conf):
    result = {}
    headers = request_headers(conf.get("key_file"))  # host_key.py
    for r in conf["replicas"]:
        index = r["index"]
        if is_marked(conf, "drained", index):
            result[index] = "drained"
            continue
        why = generates(r["port"], headers, conf["probe_timeout_s"])
        mark(conf, "failed", index, bool(why))
        result[index] = why or "ok"
    return result


def main():
    command = sys.argv[1]
    conf = load()
    os.makedirs(conf["state_dir"], exist_ok=True)
    out = {"ok": True, "command": command}
    with open(os.path.join(conf["state_dir"], "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # deploy and the probe timer never write the servers file at once
        try:
            if command in ("out", "in"):
                if len(sys.argv) < 3:
                    raise RuntimeError(f"{command} names no replica")
                for index in map(int, sys.argv[2:]):
                    mark(conf, "drained", index, command == "out")
                    if command == "in":
                        mark(conf, "failed", index, False)  # its gate just passed
            elif command == "probe":
                out["replicas"] = probe(conf)
            elif command != "sync":
                raise RuntimeError(f"unknown command {command!r}")
            if conf.get("router"):
                out["changed"] = sync_router(conf)
            else:
                out["reloaded"] = sync(conf)
        except Exception as exc:  # the caller gets the reason as JSON and a non-zero exit
            out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
    print(json.dumps(out))
    sys.exit(0 if out["ok"] else 1)


main()

# Runs ON THE HOST with python3 (standard library only), embedded in the probe script after
# host_key.py (read_key, request_headers); read-only. For the engine hosttune deploy runs here
# (the live release.json) and the host nginx front deploy wrote (/etc/nginx/conf.d/hosttune-*.conf):
# the state of every unit (the service or each replica, nginx, the replica probe and its timer) with
# the last lines of the journal of those not running; /health and one one-token generation per engine
# port; the front's /health and its upstream servers. Prints one JSON line per item.
# NB: embedded between single quotes: this file must not contain any.
import glob
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = sys.argv[1] if len(sys.argv) > 1 else ""
RELEASE = "/opt/hosttune/current/.hosttune/release.json"
REPLICA_TEMPLATE = "hosttune-engine@.service"
GATE_TIMEOUT_S = 60.0  # the default gate timeout of deploy, where the release does not record its own
MAX_GENERATION_S = 20.0  # one hung engine must not cost the whole probe
JOURNAL_LINES = 10
PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "Result", "Type", "NRestarts")


def release():
    try:
        with open(ROOT + RELEASE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def engine_units(doc):
    """The units the release runs: the templated unit becomes one instance per replica."""
    settings = doc.get("settings") or {}
    names = []
    for name in doc.get("units") or []:
        if name == REPLICA_TEMPLATE:
            names += [name.replace("@.", "@%d." % r["index"]) for r in settings.get("replicas") or []]
        else:
            names.append(name)
    return names


def engine_ports(doc):
    """(role, port) of every engine process: each replica, or the one service."""
    settings = doc.get("settings") or {}
    replicas = settings.get("replicas") or []
    if replicas:
        return [("replica %d" % r["index"], int(r["port"])) for r in replicas]
    return [("engine", int(settings["port"]))] if settings.get("port") else []


def unit_states(names):
    if not names:
        return []
    argv = ["systemctl", "show", "--property=" + ",".join(PROPERTIES)] + names
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
    blocks = [dict(l.split("=", 1) for l in b.splitlines() if "=" in l) for b in out.split("\n\n")]
    return [b for b in blocks if b.get("Id")]


def journal(name):
    argv = ["journalctl", "-u", name, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return ["journalctl: " + type(exc).__name__]
    return [l for l in result.stdout.splitlines() if not l.startswith("-- ")][-JOURNAL_LINES:]


def is_running(state):
    if state.get("Type") == "oneshot":  # the replica probe: inactive between runs, failed when its last run failed
        return state.get("ActiveState") != "failed"
    return state.get("ActiveState") == "active"


def unit_lines(names):
    for state in unit_states(names):
        line = {"kind": "unit", "name": state["Id"], "load": state.get("LoadState", ""),
                "active": state.get("ActiveState", ""), "sub": state.get("SubState", ""),
                "result": state.get("Result", ""), "type": state.get("Type", ""),
                "restarts": state.get("NRestarts", "")}
        line["journal"] = [] if is_running(state) else journal(state["Id"])
        yield line


def call(url, headers, body=None, timeout=5.0, context=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return str(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return str(exc.code), exc.read().decode("utf-8", "replace")
    except Exception as exc:
        return "error: " + type(exc).__name__, ""


def generate(base, headers, timeout):
    """One one-token generation, as deploy gate asks for: its verdict and seconds."""
    status, text = call(base + "/v1/models", headers, timeout=5.0)
    try:
        model = json.loads(text)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "/v1/models answered " + status, None
    t0 = time.monotonic()
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    status, text = call(base + "/v1/completions", headers, body, timeout=timeout)
    seconds = round(time.monotonic() - t0, 3)
    if status != "200":
        return "/v1/completions answered " + status, seconds
    return "ok", seconds


def endpoint(role, port, headers, timeout, out):
    base = "http://127.0.0.1:%d" % port
    health, _ = call(base + "/health", headers)
    line = {"kind": "endpoint", "role": role, "port": port, "health": health, "timeout_s": timeout}
    line["generation"], line["seconds"] = generate(base, headers, timeout) if health == "200" else ("not tried", None)
    out.append(line)


def endpoint_lines(doc):
    settings = doc.get("settings") or {}
    timeout = min(float(settings.get("gate_timeout_s") or GATE_TIMEOUT_S), MAX_GENERATION_S)
    try:
        headers = request_headers((settings.get("api_key") or {}).get("file"))
    except (OSError, RuntimeError) as exc:
        return [{"kind": "endpoint", "role": r, "port": p, "health": "error: key unreadable: " + str(exc)[:100],
                 "generation": "not tried", "seconds": None, "timeout_s": timeout} for r, p in engine_ports(doc)]
    ports = engine_ports(doc)
    out = []
    threads = [threading.Thread(target=endpoint, args=(r, p, headers, timeout, out)) for r, p in ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(out, key=lambda l: ports.index((l["role"], l["port"])))  # in the release order


def upstream_servers(text):
    """server ADDRESS [...] [down]; lines of an upstream, the include files read too."""
    servers = []
    for match in re.finditer(r"^\s*include\s+([^;]+);", text, re.M):
        try:
            servers += upstream_servers(open(ROOT + match.group(1).strip()).read())
        except OSError:
            servers.append({"server": match.group(1).strip(), "down": True, "reachable": False, "why": "unreadable"})
    for match in re.finditer(r"^[ \t]*server[ \t]+([^\s;{]+)([^;\n]*);", text, re.M):
        servers.append({"server": match.group(1), "down": " down" in match.group(2) + " "})
    return servers


def reachable(server):
    host, _, port = server.rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=2).close()
        return True
    except (OSError, ValueError):
        return False


def front_lines():
    for conf in sorted(glob.glob(ROOT + "/etc/nginx/conf.d/hosttune-*.conf")):
        try:
            text = open(conf).read()
        except OSError:
            continue
        name = conf[len(ROOT):]
        for match in re.finditer(r"^\s*listen\s+(\d+)([^;]*);", text, re.M):
            scheme = "https" if " ssl" in match.group(2) else "http"
            context = ssl._create_unverified_context() if scheme == "https" else None  # is it up, not whose cert
            health, _ = call("%s://127.0.0.1:%s/health" % (scheme, match.group(1)), {}, context=context)
            yield {"kind": "front", "conf": name, "port": int(match.group(1)), "scheme": scheme, "health": health}
        for server in upstream_servers(text):
            server.setdefault("reachable", reachable(server["server"]))
            yield dict(server, kind="upstream", conf=name)


def main():
    doc = release()
    fronts = list(front_lines())
    names = engine_units(doc) if doc else []
    if fronts:
        names.append("nginx.service")
    if doc:
        print(json.dumps({"kind": "release", "id": doc.get("id", ""), "engine": doc.get("engine", "")}))
    lines = list(unit_lines(names)) + (endpoint_lines(doc) if doc else []) + fronts
    for line in lines:
        print(json.dumps(line))


main()

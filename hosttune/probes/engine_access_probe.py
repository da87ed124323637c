# Runs ON THE HOST with python3 (standard library only), embedded in the probe script; read-only.
# For the engine hosttune deploy runs here (its live release.json) and the host nginx fronts deploy
# wrote (/etc/nginx/conf.d/hosttune-*.conf): the addresses each port listens on (/proc/net/tcp*)
# and the status of GET /v1/models sent WITHOUT a key. Prints one JSON line per port.
# NB: embedded between single quotes: this file must not contain any.
import glob
import json
import re
import ssl
import sys
import urllib.error
import urllib.request

ROOT = sys.argv[1] if len(sys.argv) > 1 else ""


def listening():
    """{port: [address, ...]} of every listening TCP socket."""
    found = {}
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.setdefault(int(port, 16), []).append(decode(address, width))
    return found


def decode(hex_address, width):
    raw = bytes.fromhex(hex_address)
    if width == 8:
        return ".".join(str(b) for b in reversed(raw))
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # four host-order 32-bit words
    full = b"".join(words)
    if full[:12] == bytes(10) + b"\xff\xff":
        return ".".join(str(b) for b in full[12:])
    return ":".join(full[i:i + 2].hex() for i in range(0, 16, 2))


def endpoints():
    out = []
    try:
        with open(ROOT + "/opt/hosttune/current/.hosttune/release.json") as f:
            doc = json.load(f)
        port = (doc.get("settings") or {}).get("port")
        if port:
            out.append({"role": "engine", "port": int(port), "scheme": "http"})
    except (OSError, ValueError):
        pass
    for conf in sorted(glob.glob(ROOT + "/etc/nginx/conf.d/hosttune-*.conf")):
        try:
            text = open(conf).read()
        except OSError:
            continue
        for match in re.finditer(r"^\s*listen\s+(\d+)([^;]*);", text, re.M):
            scheme = "https" if " ssl" in match.group(2) else "http"
            out.append({"role": "nginx", "port": int(match.group(1)), "scheme": scheme})
    return out


def status_without_key(scheme, port):
    context = ssl._create_unverified_context() if scheme == "https" else None  # who answers, not whose cert
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/v1/models", timeout=3, context=context) as r:
            return str(r.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except Exception as exc:
        return "error: " + type(exc).__name__


def main():
    sockets = listening()
    for endpoint in endpoints():
        endpoint["listen"] = sorted(set(sockets.get(endpoint["port"], [])))
        endpoint["status"] = status_without_key(endpoint["scheme"], endpoint["port"]) if endpoint["listen"] else "closed"
        print(json.dumps(endpoint))


main()

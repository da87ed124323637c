# Runs ON THE HOST (standard library only): put in front of gate_probe.py and replica_lb.py, the
# scripts that call a deployed engine. A keyed service's EnvironmentFile holds its API key as one
# NAME=KEY line; the scripts read it there, so the key is never in their arguments (ps).


def read_key(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, sep, value = line.strip().partition("=")
            if sep and value and not name.startswith("#"):
                return value.strip().strip("'\"")
    raise RuntimeError(f"{path} holds no KEY=VALUE line")


def request_headers(key_file):
    """A JSON request's headers, with `Authorization: Bearer KEY` when the service has a key file."""
    headers = {"Content-Type": "application/json"}
    if key_file:
        headers["Authorization"] = "Bearer " + read_key(key_file)
    return headers

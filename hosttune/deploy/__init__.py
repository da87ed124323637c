"""Deploy an engine as a systemd service: versioned releases, warmup, a health gate, a way back.

settings.py (what to serve, merged from preset, inventory and --set), placement.py (GPUs,
NUMA node, preflight), release.py (release id and host layout), units.py (systemd units and
nginx from templates/), plan.py (the host operations, as data), gate.py (health, warmup,
one-token generation), host.py (one host's deploy and rollback), rollout.py (the fleet:
batches, multi-node order, load balancer).

Every change to a host goes through hosttune.execute.remote (atomic, verified writes and
links); commands are argument vectors sent through the host's transport.
"""

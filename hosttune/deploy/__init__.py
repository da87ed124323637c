"""Deploy an engine as a systemd service: versioned releases, warmup, a health gate, a way back.

settings.py (what to serve, merged from preset, inventory and --set), model.py (the model's
heads and weight size, read on the host), placement.py (replicas × tensor parallel over the
GPUs, NUMA nodes, ports, preflight), release.py (release id and host layout), units.py
(systemd units and nginx from templates/), plan.py (the host operations, as data),
access.py (the group's API key and the host's nginx front settings), front.py (the key file,
the TLS files and the host's one nginx front), replicas.py (a host of several replicas as
files: templated unit, their nginx front, probe, Prometheus targets), replica_lb.py (runs on
the host: replicas in and out of nginx, the probe), host_key.py (runs on the host in front of
the gate and replica_lb.py: the key they send), router.py (deploy.router's unit and front),
prefix_router.py and prefix_table.py (run on the host: the prefix router and its placement),
flagcheck.py (flags against the installed
release's --help), bundled_flags.py (the bundled engine's flags against engine/'s serve options,
before any host), gate.py (health, warmup, one-token generation), rolling.py (replicas
restarted one at a time, drained), host.py (one host's deploy and rollback), rollout.py (the
fleet: canaries, batches, multi-node order, load balancer), canary.py (the canaries' SLO bench).

Every change to a host goes through hosttune.execute.perform (atomic, verified writes and
links); everything else here only reads the host.
"""

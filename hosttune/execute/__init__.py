"""Execute: the one place that changes hosts. Backups first, atomic writes, a journal on the host.

runner.py runs one host's plan, rollback.py undoes a run from its journal, rollout.py
drives a fleet in batches, reboot.py reboots and waits, recap.py reports what happened.
"""

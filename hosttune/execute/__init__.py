"""Execute: the one place that changes hosts. Backups first, atomic writes, a journal on the host.

perform.py turns one operation into a changing command (apply and deploy alike), runner.py
runs one host's plan under its journal, rollback.py undoes a run from its journal, rollout.py
drives a fleet in batches, reboot.py reboots and waits, recap.py reports what happened.
"""

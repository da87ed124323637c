"""Remediation: failing findings in, the lowest rung of a ladder that fixes each, climbed one rung at a
time with a re-check between rungs (restart, drain, diagnose, reset, reboot, cordon).

`rungs` names the rungs, `faults` turns facts and findings into faults with their ladders, `xid`
classifies Xid events with their history (`history`, the ledger kept on each host), `steps` turns
a rung into operations, `breaker` stops cordoning fleet-wide, `climb` runs one host's ladders
through the executor and `fleet` runs them across an inventory.
"""

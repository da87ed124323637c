"""The plan stage: what apply will change on a host, read-only and the same for a dry run.

host_plan builds a host's plan (probe, checks, actions), state reads what holds now in one
round trip (state.sh), resolve drops what already holds, render prints the plan.
"""

"""The gates: restarts, liveness, resources, rollouts, dynamics, duty_cycle — one module each.

Each is a pure `check(evidence) -> GateResult` (restarts: `RestartsResult`); `registry.GATES` is
the ordered mapping the diagnosis runs, `base` the contract they share.
"""

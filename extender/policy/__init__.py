"""Pure scheduling policy: plain data in, decisions out, no I/O.

The extender service, the simulator and the benchmarks all call these modules, so the same
code decides in production, in simulation and in measurement.
"""

"""Pre-scheduling simulator: replays workloads through the extender's own policy code.

``tessera simulate trace`` replays the Alibaba GPU trace to compare packing policies;
``tessera simulate queues`` replays a queue workload through fairness and placement.
"""

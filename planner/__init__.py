"""pipeplan planner: the plan itself (graph, cost model, search, plan format, report) at this level.

- base, used by every package: ``errors``, ``fileio``, ``table``;
- ``planner.schedule``: action orders, simulator and timelines (what a schedule does in time);
- ``planner.runtime``: apply, launch, replay and verify on torch (imported only by the CLI, examples
  and benchmarks).

Imports nothing heavy.
"""

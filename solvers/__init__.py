"""pipeplan solvers: pure functions on numbers (no torch). One problem type, one solution type.

- :mod:`solvers.problem`: :class:`PartitionProblem`, :class:`PartitionSolution`, and :func:`evaluate`,
  the single definition of the objective every solver optimises.
- :mod:`solvers.dp`: exact dynamic program, pinned units included.
- :mod:`solvers.ilp`: the same problem as a MILP (pulp; HiGHS or CBC), plus heterogeneous devices and a cap on
  units per stage.
- :mod:`solvers.brute`: exhaustive enumeration, the reference for tests.
- :mod:`solvers.baselines`: the partitioners people use today, named as such.
"""

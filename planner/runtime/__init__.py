"""The runtime on torch: apply a plan with ``torch.distributed.pipelining`` (``apply``), launch ranks
(``launch``), replay stages in one process (``replay``) and hold the measurement against the prediction
(``verify``; what a rank runs and times in ``rank_timing``, the report in ``verify_report``). Uses the plan
and the schedule packages; only the CLI, examples and benchmarks import it."""

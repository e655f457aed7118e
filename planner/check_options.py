"""``pipeplan check``'s options (:class:`CheckOptions`), apart from the check itself so that the command line
is built without importing the planner."""

from __future__ import annotations

from dataclasses import dataclass

from planner.options import check_fields, int_range, option, option_like, rename
from planner.request import ClusterOptions, PlanOptions

__all__ = ["CheckOptions", "CHECKED_TRAINERS"]

CHECKED_TRAINERS = ("megatron", "torchtitan", "deepspeed")
"""The trainers whose configurations ``check --from`` reads (accelerate's prepare_pippy is for inference)."""

_MAX_DEVICES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class CheckOptions:
    """What ``check`` is told besides the configuration: how names map, and the devices (as ``plan`` takes them)."""

    renames: tuple[tuple[str, str], ...] = option(
        (),
        flag="--rename",
        parse=rename,
        repeat=True,
        metavar="OLD=NEW",
        help="map a module-name prefix of the profiled model onto the trainer's, as `export` takes it "
        "(repeatable; torchtitan's module names and DeepSpeed's PLAN_UNITS; default: the names as profiled)",
    )
    devices: int | None = option(
        None,
        parse=int_range(1, _MAX_DEVICES),
        metavar="N",
        help="the job's world size, which sets the data-parallel degree (default: torchrun's --nproc-per-node x "
        "--nnodes in a Megatron command line, DeepSpeed's batch arithmetic, else one replica)",
    )
    # The devices as `plan` takes them: the same flags, readers, defaults and help.
    devices_per_node: int | None = option_like(ClusterOptions, "devices_per_node")
    memory_bytes: int | None = option_like(PlanOptions, "memory_bytes")
    link_bytes_per_s: float | None = option_like(PlanOptions, "link_bytes_per_s")
    link_latency_s: float | None = option_like(PlanOptions, "link_latency_s")
    intra_node_bytes_per_s: float | None = option_like(ClusterOptions, "intra_node_bytes_per_s")
    inter_node_bytes_per_s: float | None = option_like(ClusterOptions, "inter_node_bytes_per_s")
    placement: str | None = option(
        None,
        choices=("pipeline-in-node", "replicas-in-node"),
        help="where the job puts its ranks when the configuration does not say (torchtitan, whose launcher may "
        "rewrite RANK): a replica's pipeline on consecutive devices, or a stage's replicas (default: what the "
        "configuration says, Megatron's --use-tp-pp-dp-mapping or DeepSpeed's topology, else the trainers' own "
        "order, replicas-in-node)",
    )
    optimizer: str = option_like(PlanOptions, "optimizer")
    calibration: str = option_like(PlanOptions, "calibration")
    no_best: bool = option(False, help="check the configuration only: search no plan to compare it with")

    def __post_init__(self) -> None:
        check_fields(self)

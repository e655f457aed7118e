"""``pipeplan check``'s options (:class:`CheckOptions`), apart from the check itself so that the command line
is built without importing the planner."""

from __future__ import annotations

from dataclasses import dataclass

from planner.options import bandwidth, check_fields, int_range, nonneg_float, option, rename
from planner.request import memory

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
    devices_per_node: int | None = option(None, parse=int_range(1, _MAX_DEVICES), metavar="G", help="devices per node")
    memory_bytes: int | None = option(
        None,
        flag="--memory",
        parse=memory,
        unit="bytes",
        metavar="80GiB",
        help="memory of every device (default: the profiled device's; on CPU, shared by one pipeline's ranks), "
        "less 10%% headroom",
    )
    link_bytes_per_s: float | None = option(
        None, flag="--bandwidth", parse=bandwidth, unit="bytes/s", metavar="25GB/s", help="one pipeline's link"
    )
    link_latency_s: float | None = option(
        None, flag="--latency", parse=nonneg_float, unit="s", metavar="SECONDS", help="link latency per message"
    )
    intra_node_bytes_per_s: float | None = option(
        None,
        flag="--intra-node-bandwidth",
        parse=bandwidth,
        unit="bytes/s",
        metavar="450GB/s",
        help="per device, each way, inside a node (a mesh's)",
    )
    inter_node_bytes_per_s: float | None = option(
        None,
        flag="--inter-node-bandwidth",
        parse=bandwidth,
        unit="bytes/s",
        metavar="50GB/s",
        help="per device, each way, between nodes (a mesh's)",
    )
    placement: str | None = option(
        None,
        choices=("pipeline-in-node", "replicas-in-node"),
        help="where the job puts its ranks when the configuration does not say (torchtitan, whose launcher may "
        "rewrite RANK): a replica's pipeline on consecutive devices, or a stage's replicas (default: what the "
        "configuration says, Megatron's --use-tp-pp-dp-mapping or DeepSpeed's topology, else the trainers' own "
        "order, replicas-in-node)",
    )
    optimizer: str = option("adam", choices=("sgd", "adam"), help="the optimizer (default adam)")
    calibration: str = option(
        "auto",
        metavar="auto|none|CALIBRATION.json",
        help="runtime terms, as `plan --calibration` (default auto)",
    )
    no_best: bool = option(False, help="check the configuration only: search no plan to compare it with")

    def __post_init__(self) -> None:
        check_fields(self)

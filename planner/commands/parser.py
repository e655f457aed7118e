"""The command line's parser: every command, its options, their help and limits (``cli.py`` runs them)."""

from __future__ import annotations

import argparse

from planner.commands.options import (
    Parser,
    float_list,
    int_list,
    int_range,
    nonneg_float,
    positive_float,
    rename,
)
from planner.commands.search_arguments import add_cluster_arguments, add_search_arguments
from planner.export import RELEASES
from planner.limits import (
    MAX_GLOBAL_BATCH,
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_REPEATS,
    MAX_STEPS,
)
from planner.schedule.orders import Schedule

__all__ = ["build_parser", "HelpFormatter"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's default appended to its help unless the help gives it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        quiet = (None, False, argparse.SUPPRESS)
        if "default" in text or action.default in quiet or action.option_strings == [] or action.nargs == 0:
            return text
        shown = ",".join(map(str, action.default)) if isinstance(action.default, tuple) else action.default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipeplan")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "unknown"


TOP = """\
pipeplan: profile a PyTorch model once, get an exact pipeline-parallel plan, apply it with
torch.distributed.pipelining.

  pipeplan calibrate --ranks 2 --out cpu.calibration.json  measure what the runtime adds (once per machine)
  pipeplan profile gpt2-small --out gpt2.profile.json      measure every unit on this device
  pipeplan calibrate --ranks 2 --model gpt2-small --profile gpt2.profile.json --out gpt2.calibration.json
                                                           learn what this model's actions pay in a pipeline
  pipeplan plan gpt2.profile.json --ranks 4 --global-batch 16 --out gpt2.plan.json
                                                           the best plan for 4 ranks (devices)
  pipeplan plan gpt2.profile.json --ranks 4 --global-batch 16 --for megatron --out gpt2.mlm.plan.json
                                                           the best plan Megatron-Core can express
  pipeplan simulate gpt2.plan.json --out timeline.png      see the bubble
  pipeplan verify gpt2.plan.json --model gpt2-small        run it, compare with the prediction
  pipeplan tune gpt2.profile.json --model gpt2-small --ranks 2 --global-batch 8 --out gpt2.plan.json
                                                           run the best candidates, keep the fastest
  pipeplan show gpt2.plan.json                             reprint a profile or plan
  pipeplan export gpt2.mlm.plan.json --to megatron         the plan as Megatron-Core flags (also torchtitan,
                                                           DeepSpeed, accelerate)

Run `pipeplan COMMAND --help` for each command's options.
"""


def build_parser() -> argparse.ArgumentParser:
    from profiles.models import BUILTIN_NAMES

    fmt = HelpFormatter
    parser = Parser(prog="pipeplan", description=TOP, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"pipeplan {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser(
        "profile",
        help="measure a model unit by unit into a profile JSON",
        formatter_class=fmt,
        description=(
            "Measure every unit (block) of MODEL on this device: forward and backward time, FLOPs (fvcore,\n"
            "multiply-adds), output and saved-activation bytes, parameters, and the tensors flowing between\n"
            "units, for several micro-batch sizes. The unit sum is checked against the whole model.\n\n"
            f"MODEL is a built-in ({', '.join(BUILTIN_NAMES)}), path/to/file.py:NAME or\n"
            "package.module:NAME, NAME being a zero-argument function returning a profiles.workload.Workload,\n"
            "or hf:path/to/config.json (a transformers model built from a local config, random weights;\n"
            "--task, --seq-len; the profile's model name is the full spec verify takes).\n\n"
            "example:\n  pipeplan profile gpt2-small --micro-batch-sizes 1,2,4 --out gpt2.profile.json"
        ),
    )
    p.add_argument("model", metavar="MODEL", help="the model to profile (see above)")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="where to write the profile (atomically)")
    p.add_argument(
        "--micro-batch-sizes",
        type=int_list,
        default=(1, 2, 4),
        metavar="1,2,4",
        help="micro-batch sizes to measure (default 1,2,4)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to measure: this CPU or a GPU")
    p.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="the weights' and activations' dtype"
    )
    p.add_argument(
        "--seq-len",
        type=int_range(1, 1 << 20),
        default=None,
        help="sequence length in tokens of built-in language models and hf: configs (default: the model's, "
        "128 for the built-ins)",
    )
    p.add_argument(
        "--task",
        choices=("causal-lm", "masked-lm", "seq2seq", "image-classification"),
        default=None,
        help="what an hf:CONFIG.json model is built for (default: from the config's architectures)",
    )
    p.add_argument(
        "--repeats",
        type=int_range(1, MAX_REPEATS),
        default=3,
        help="timed rounds at least (each times every unit once); the median is kept (default 3)",
    )
    p.add_argument(
        "--max-repeats",
        type=int_range(1, MAX_REPEATS),
        default=15,
        help="timed rounds at most: from the 5th, rounds go on until the median unit sum is known to 2%% "
        "(its standard error, from the rounds' spread) (default 15)",
    )
    p.add_argument(
        "--warmup", type=int_range(0, MAX_REPEATS), default=1, help="untimed warm-up runs of each unit (default 1)"
    )
    p.add_argument(
        "--min-time",
        type=nonneg_float,
        default=None,
        metavar="SECONDS",
        help="rounds (each visits every micro-batch size) also go on until they span this long per size "
        "(default 2): a shared machine changes speed from one second to the next, and a median over a moment "
        "sees one speed",
    )
    p.add_argument(
        "--units",
        default=None,
        metavar="FQN,FQN|DEPTH",
        help="unit FQNs in execution order, or a module depth (default: the largest repeated block list)",
    )
    threads = p.add_mutually_exclusive_group()
    threads.add_argument(
        "--threads",
        type=int_range(1, 4096),
        default=None,
        help="CPU intra-op threads while measuring (default: cores // 2, what each rank of a 2-rank pipeline on "
        "this machine gets; the profile also records the scaling to every other rank count's threads)",
    )
    threads.add_argument(
        "--ranks",
        type=int_range(1, MAX_RANKS),
        default=None,
        metavar="P",
        help="time the units with the threads each of P ranks on this machine will get, cores // P, as the runtime "
        "sets (default: P = 2; a CPU profile also records the whole model at every rank count's threads, "
        "and a plan for P ranks uses those)",
    )
    p.add_argument(
        "--meta",
        action="store_true",
        help="build the model on the meta device (no weights held) and materialise one unit at a time to measure "
        "it, for a model larger than the device; the whole model is not measured (automatic for an hf: config "
        "whose weights and gradients exceed the device's memory)",
    )
    p.add_argument(
        "--sample-blocks",
        action="store_true",
        help="with --meta (implied): measure one unit of each run of identical consecutive units (decoder layers) "
        "and copy its numbers to the others; the profile lists the copies in settings.sampled_from",
    )
    p.add_argument(
        "--no-pipeline-run",
        action="store_true",
        help="skip the short run, on a CPU, of the model as a 2-rank 1F1B pipeline (about 10-40 s) that learns what "
        "its actions cost inside a pipeline; `plan` then uses the calibration shipped for the device",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "calibrate",
        help="measure the runtime's costs (P2P, per-action overhead, optimizer, co-location, transfers) on real ranks",
        formatter_class=fmt,
        description=(
            "Run a short job on RANKS local processes (gloo on CPU, NCCL on GPUs) and measure what a real\n"
            "iteration adds to the profiled compute: point-to-point latency and bandwidth, the overhead of\n"
            "each action of each torch schedule, optimizer step time per parameter (Adam, SGD), how much\n"
            "slower compute runs when every rank is busy (co-location), and on CPU the compute each byte\n"
            "sent or received takes from its rank (gloo copies on the ranks' cores). Under a minute on CPU.\n"
            "Give the file to `pipeplan plan --calibration`. Measure on a quiet machine.\n\n"
            "With --model and --profile it then runs that model on the same ranks under 1F1B (and, with\n"
            "--learn every, or auto for a model whose 1F1B plan steps in under 0.5 s, the best plan of every\n"
            "other schedule, in the same launch, interleaved) and refits the calibration from the runs: real\n"
            "stages pay more per action in a pipeline than the trivial ones measured first (0.15 ms for a\n"
            "small MLP, 0.45 ms for gpt2-tiny on a 2-core CPU), and only a run of the model shows how much.\n"
            "Plans of that model predicted with the result came within 4-8 % (median) where the machine's\n"
            "constants alone were 10-53 % off. `pipeplan profile` does the same on CPU unless told not to.\n\n"
            "examples:\n  pipeplan calibrate --ranks 2 --out cpu.calibration.json\n"
            "  pipeplan calibrate --ranks 2 --model gpt2-tiny --profile gpt2-tiny.profile.json \\\n"
            "      --out gpt2-tiny.calibration.json\n"
            "  pipeplan calibrate --ranks 2 --start cpu.calibration.json --model gpt2-tiny \\\n"
            "      --profile gpt2-tiny.profile.json --out gpt2-tiny.calibration.json   (skip re-measuring)"
        ),
    )
    p.add_argument(
        "--ranks", type=int_range(1, MAX_RANKS), default=2, help="ranks to run, as in your pipeline (default 2)"
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="calibrate gloo on this CPU or NCCL on GPUs"
    )
    p.add_argument(
        "--repeats", type=int_range(1, MAX_REPEATS), default=15, help="timed repeats of each measurement (median)"
    )
    p.add_argument("--timeout", type=positive_float, default=300.0, help="seconds before every rank is stopped")
    p.add_argument("--model", metavar="MODEL", help="also run this model's plans and learn its per-action cost")
    p.add_argument("--profile", metavar="PROFILE.json", help="with --model: the model's profile (plans its run)")
    p.add_argument(
        "--global-batch",
        type=int_range(1, MAX_GLOBAL_BATCH),
        help="with --model: the batch of its run (default: 2 micro-batches per rank of the largest profiled size)",
    )
    p.add_argument(
        "--steps", type=int_range(1, MAX_STEPS), default=5, help="with --model: timed steps of its run (default 5)"
    )
    p.add_argument(
        "--learn",
        choices=("auto", "1f1b", "every"),
        default="auto",
        help="with --model: run 1F1B's plans only (one a profiled micro-batch size), or every schedule's at two "
        "micro-batch counts as well, each learning its own overhead (auto: every where 1F1B's plan steps in "
        "under 0.5 s; default auto)",
    )
    p.add_argument(
        "--start",
        metavar="CALIBRATION.json",
        help="with --model: refit this calibration ('auto': the shipped one) instead of measuring the machine first",
    )
    p.add_argument("--out", required=True, metavar="CALIBRATION.json", help="where to write the calibration")

    p = sub.add_parser(
        "show",
        help="print a profile or plan file as a table",
        formatter_class=fmt,
        description="Reprint the table of a profile or a plan file.\n\nexample:\n  pipeplan show gpt2.profile.json "
        "--micro-batch-size all",
    )
    p.add_argument("file", metavar="FILE.json", help="a profile or a plan")
    p.add_argument(
        "--micro-batch-size",
        default=None,
        metavar="N|all",
        help="a profile's table at this micro-batch size, or at every size (default: the smallest)",
    )

    p = sub.add_parser(
        "plan",
        help="solve for the best pipeline plan from a profile",
        formatter_class=fmt,
        description=(
            "Find stage boundaries, micro-batch size and count, schedule and recomputation that minimise the\n"
            "iteration time under each device's memory. An exact DP (or ILP) solves each candidate for its\n"
            "declared objective; the schedule simulator then scores the best partitions and the best\n"
            "simulated plan wins. Baselines (uniform, by parameters, by time) are scored the same way.\n\n"
            "example:\n"
            "  pipeplan plan gpt2.profile.json --ranks 4 --global-batch 16 --memory 16GiB --out gpt2.plan.json"
        ),
    )
    p.add_argument("profile", metavar="PROFILE.json", help="a profile from `pipeplan profile`")
    p.add_argument("--out", required=True, metavar="PLAN.json", help="where to write the plan (atomically)")
    add_search_arguments(p, cluster=True)
    add_cluster_arguments(p)
    p.add_argument(
        "--record-timing",
        action="store_true",
        help="store the search time in the plan (otherwise null, so same inputs give the same bytes)",
    )

    p = sub.add_parser(
        "tune",
        help="run the planner's best candidates for real, refit the calibration, keep the fastest",
        formatter_class=fmt,
        description=(
            "Close the loop: take the planner's K best distinct plans (schedules, micro-batch sizes,\n"
            "boundaries, recomputation), run each on real ranks, refit the calibration from what was measured,\n"
            "plan again with it, and write the plan that measured fastest, with its measured numbers. With a\n"
            "core or GPU for every rank the candidates run as processes in one launch, interleaved round by\n"
            "round, and are ranked by their ratios over the rounds (a machine whose speed moves favours none);\n"
            "else one at a time in a one-process replay. The refit\n"
            "calibration is written beside it; give it to `pipeplan plan --calibration` next time.\n\n"
            "example:\n"
            "  pipeplan tune gpt2.profile.json --model gpt2-small --ranks 2 --global-batch 8 --out gpt2.plan.json"
        ),
    )
    p.add_argument("profile", metavar="PROFILE.json", help="a profile from `pipeplan profile`")
    p.add_argument("--model", required=True, metavar="MODEL", help="the model the profile was made for")
    p.add_argument("--out", required=True, metavar="PLAN.json", help="where to write the fastest measured plan")
    p.add_argument(
        "--calibration-out",
        default=None,
        metavar="CALIBRATION.json",
        help="where the refit calibration goes (default: beside the plan, PLAN.calibration.json)",
    )
    p.add_argument("--candidates", type=int_range(1, 32), default=4, help="distinct plans to run (default 4)")
    p.add_argument(
        "--steps",
        type=int_range(1, MAX_STEPS),
        default=3,
        help="the fewest timed steps per candidate (default 3; interleaved: at least that many rounds, as many as "
        "fit in about 30 s)",
    )
    p.add_argument(
        "--warmup",
        type=int_range(0, MAX_STEPS),
        default=1,
        help="untimed steps per candidate (default 1; processes mode also warms up for at least 1 s)",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "processes", "replay"),
        default="auto",
        help="processes: one process per rank; replay: every stage in one process, in the schedule's order; auto: "
        "processes when there is a core (or GPU) per rank (default auto)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="run the candidates on CPU or GPUs")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per candidate before it is stopped")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_search_arguments(p, cluster=False)

    p = sub.add_parser(
        "export",
        help="print the plan's layout as torchtitan, Megatron-Core, DeepSpeed or accelerate configuration",
        formatter_class=fmt,
        description=(
            "Write what each trainer takes for the plan's stages (docs/export.md):\n"
            "  torchtitan  --parallelism.module_fqns_per_model_part, the pipeline degree, schedule, batch sizes\n"
            "              and --training.disable_cuda_graphs (torchtitan 0.3's command-line overrides)\n"
            "  megatron    --pipeline-model-parallel-layout 'Et*2|t*2L' with --pipeline-model-parallel-size,\n"
            "              --num-layers and batch sizes (flags); E = units before the first decoder layer,\n"
            "              t = each decoder layer (units PREFIX.N), L = units after the last one (norm, head)\n"
            "  deepspeed   a PipelineModule subclass whose _partition_layers sets self.parts to the plan's\n"
            "              boundaries, and the layer count (Python)\n"
            "  accelerate  prepare_pippy(model, split_points=[...], num_chunks=M) (Python; inference only)\n"
            "What a trainer cannot express is refused with the reason (a cut inside Megatron's embedding or\n"
            "inside a decoder layer, a non-transformer model for Megatron, interleaved stages for DeepSpeed and\n"
            "accelerate, names nested deeper than torchtitan splits).\n\n"
            "examples:\n"
            "  pipeplan export gpt2.plan.json --to megatron\n"
            "  pipeplan export llama.plan.json --to torchtitan --rename model.embed_tokens=tok_embeddings \\\n"
            "      --rename model.layers=layers --rename model.norm=norm --out pp.flags"
        ),
    )
    p.add_argument("plan", metavar="PLAN.json", help="a plan from `pipeplan plan`")
    p.add_argument(
        "--to", required=True, choices=("torchtitan", "megatron", "deepspeed", "accelerate"), help="the trainer"
    )
    p.add_argument(
        "--rename",
        type=rename,
        action="append",
        metavar="OLD=NEW",
        help="map a module-name prefix of the profiled model onto the trainer's model (repeatable; the longest "
        "matching prefix wins; NEW may be empty to strip the prefix; default: the names as profiled)",
    )
    p.add_argument("--out", default=None, metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.add_argument(
        "--trainer-version",
        default=None,
        metavar="VERSION",
        help="the trainer's release to write for; a release outside the series an export is for is refused "
        "(default: the release each was run against: "
        + "; ".join(f"{r.package} {r.current}, for {r.series_text}" for r in RELEASES.values())
        + ")",
    )

    p = sub.add_parser(
        "simulate",
        help="predict an iteration and draw its timeline",
        formatter_class=fmt,
        description=(
            "Simulate the schedule of a plan (or a what-if pipeline) action by action, print an ASCII timeline\n"
            "and optionally a Gantt chart PNG with the bubble visible.\n\n"
            "With --compare, the same stages under other schedules, each with the runtime terms the plan was\n"
            "predicted with (its calibration's overhead per action of that schedule): the plan's own schedule\n"
            "reproduces the plan's predicted iteration.\n\n"
            "examples:\n  pipeplan simulate gpt2.plan.json --out timeline.png\n"
            "  pipeplan simulate gpt2.plan.json --compare gpipe,1f1b,zero-bubble --compare-out schedules.png\n"
            "  pipeplan simulate --ranks 4 --micro-batches 8 --schedule gpipe --stage-times 1,1,2,1\n"
            "  pipeplan simulate --ranks 4 --micro-batches 8 --compare gpipe,1f1b,interleaved-1f1b\n"
            "  pipeplan simulate --ranks 4 --micro-batches 8 --schedule zero-bubble --stage-times 1 \\\n"
            "      --backward-times 1 --weight-times 1"
        ),
    )
    p.add_argument("plan", nargs="?", metavar="PLAN.json", help="a plan (or none, for a what-if: the options below)")
    p.add_argument(
        "--out",
        "--png",
        dest="out",
        default=None,
        metavar="timeline.png",
        help="write a Gantt chart: .png, .svg or .pdf by the file's suffix (default: none)",
    )
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument(
        "--compare",
        default=None,
        metavar="gpipe,1f1b,...",
        help="the same stages under each of these schedules, on the plan's footing (default: none)",
    )
    p.add_argument(
        "--compare-out",
        "--compare-png",
        dest="compare_out",
        default=None,
        metavar="schedules.png",
        help="with --compare: write the schedules' Gantt charts stacked, .png, .svg or .pdf (default: none)",
    )
    p.add_argument(
        "--ranks", "--stages", dest="ranks", type=int_range(1, MAX_RANKS), default=None, help="what-if: ranks P"
    )
    p.add_argument(
        "--micro-batches",
        "--microbatches",
        dest="micro_batches",
        type=int_range(1, MAX_MICROBATCHES),
        default=None,
        help="what-if: micro-batches M",
    )
    p.add_argument(
        "--schedule",
        default=None,
        choices=[x.value for x in Schedule],
        help="what-if: the schedule; naive runs one micro-batch through the stages in turn, no pipelining, "
        "the baseline the bubble is measured against (default 1f1b)",
    )
    p.add_argument(
        "--virtual-stages",
        type=int_range(1, 16),
        default=None,
        help="what-if: stages per rank of interleaved-1f1b, looped-bfs (default 2) and zero-bubble (default 1); "
        "zbv and dualpipev always run 2",
    )
    p.add_argument(
        "--stage-times",
        type=float_list,
        default=None,
        metavar="1,1,2,1",
        help="what-if: forward seconds per stage, or one value for every stage (default: 1 each)",
    )
    p.add_argument(
        "--backward-times",
        type=float_list,
        default=None,
        metavar="SECONDS,...",
        help="what-if: backward seconds per stage; with --weight-times, its input-gradient part B (the full "
        "backward is B + W) (default: --backward-ratio x forward)",
    )
    p.add_argument(
        "--weight-times",
        type=float_list,
        default=None,
        metavar="SECONDS,...",
        help="what-if: weight-gradient seconds W per stage: split-backward schedules (zero-bubble, zbv, dualpipev) "
        "run it apart (default: none, the backward stays unsplit)",
    )
    p.add_argument(
        "--backward-ratio",
        type=positive_float,
        default=1.0,
        help="what-if: backward = ratio x forward when --backward-times is not given (default 1)",
    )

    p = sub.add_parser(
        "verify",
        help="run a plan with torch.distributed.pipelining and compare with the prediction",
        formatter_class=fmt,
        description=(
            "Launch the plan's ranks (gloo on CPU, NCCL on GPUs), run warm-up and timed steps, and print the\n"
            "predicted vs measured time per stage and per iteration. Exits 1 when the iteration error exceeds\n"
            "--tolerance. With fewer cores or GPUs than ranks, replay mode runs every stage in one process in\n"
            "the schedule's order and feeds the measured times through the simulator.\n\n"
            "example:\n  pipeplan verify gpt2.plan.json --model gpt2-small --steps 5 --out report.json"
        ),
    )
    p.add_argument("plan", metavar="PLAN.json", help="a plan from `pipeplan plan`")
    p.add_argument("--model", required=True, metavar="MODEL", help="the model the plan was made for")
    p.add_argument(
        "--steps",
        type=int_range(1, MAX_STEPS),
        default=5,
        help="timed steps at least (default 5); processes mode also times for at least 2 s, as a shared machine's "
        "speed changes from one second to the next; the median step is measured",
    )
    p.add_argument(
        "--warmup",
        type=int_range(0, MAX_STEPS),
        default=1,
        help="untimed steps first (default 1); processes mode also warms up for at least 1 s, as a fresh rank's "
        "first steps run slow",
    )
    p.add_argument(
        "--tolerance",
        type=positive_float,
        default=0.15,
        help="the largest iteration-time error that passes, as a fraction: 0.15 = 15%% (default 0.15)",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "processes", "replay"),
        default="auto",
        help="processes: one process per rank (gloo or NCCL); replay: every stage in one process, in the "
        "schedule's order, its times through the simulator; auto: processes when there is a core (or GPU) per "
        "rank (default auto)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="run on this CPU (gloo) or GPUs (NCCL)")
    p.add_argument("--check-numerics", action="store_true", help="compare loss and gradients with one process")
    p.add_argument("--timeout", type=positive_float, default=600.0, help="seconds before every rank is stopped")
    p.add_argument(
        "--out", default=None, metavar="report.json", help="also write the report as JSON (default: print only)"
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="when a rank fails, print its full traceback (from the rank's process) before the one-line error",
    )
    p.add_argument(
        "--memory-tolerance",
        type=positive_float,
        default=0.10,
        help="allowed error of each stage's measured memory peak against its prediction (default 0.10 = 10%%); "
        "a stage over it, or over the memory the plan gave it, fails the verdict",
    )
    return parser

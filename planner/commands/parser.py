"""The command line's parser: every command with its description, its options built from its options
dataclass (planner/commands/command_options.py, where each flag's help, default and limits live); ``cli.py``
runs them."""

from __future__ import annotations

import argparse

from planner.commands.command_options import (
    CheckCommand,
    ExportOptions,
    PlanCommand,
    ShowOptions,
    TuneCommand,
    VerifyCommand,
)
from planner.commands.options import Parser, add_options, options_from
from planner.runtime.run_options import CalibrateOptions
from planner.simulate_options import SimulateOptions
from profiles.profile_options import ProfileOptions

__all__ = ["build_parser", "HelpFormatter", "COMMANDS", "command_options"]


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
  pipeplan check gpt2.profile.json --from megatron megatron.args --memory 16GiB
                                                           your own configuration predicted, beside the best

Run `pipeplan COMMAND --help` for each command's options.
"""


COMMANDS: dict[str, tuple[type, dict[str, str]]] = {
    "profile": (
        ProfileOptions,
        dict(
            help="measure a model unit by unit into a profile JSON",
            description=(
                "Measure every unit (block) of MODEL on this device: forward and backward time, FLOPs (fvcore,\n"
                "multiply-adds), output and saved-activation bytes, parameters, and the tensors flowing between\n"
                "units, for several micro-batch sizes. The unit sum is checked against the whole model.\n\n"
                "MODEL is a built-in ({builtins}), path/to/file.py:NAME or\n"
                "package.module:NAME, NAME being a zero-argument function returning a profiles.workload.Workload,\n"
                "or hf:path/to/config.json (a transformers model built from a local config, random weights;\n"
                "--task, --seq-len; the profile's model name is the full spec verify takes).\n\n"
                "example:\n  pipeplan profile gpt2-small --micro-batch-sizes 1,2,4 --out gpt2.profile.json"
            ),
        ),
    ),
    "calibrate": (
        CalibrateOptions,
        dict(
            help="measure the runtime's costs (P2P, per-action overhead, optimizer, co-location, transfers) on "
            "real ranks",
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
        ),
    ),
    "show": (
        ShowOptions,
        dict(
            help="print a profile, plan, verify report or device model (a file, or a GPU: h100-80gb) as a table",
            description="Reprint the table of a profile, a plan or a verify report (verify --out) file, or print "
            "what a device model assumes of a GPU (a built-in's name or a device file: docs/cost-model.md)."
            "\n\nexamples:\n"
            "  pipeplan show gpt2.profile.json --micro-batch-size all\n  pipeplan show report.json\n"
            "  pipeplan show h100-80gb",
        ),
    ),
    "plan": (
        PlanCommand,
        dict(
            help="solve for the best pipeline plan from a profile",
            description=(
                "Find stage boundaries, micro-batch size and count, schedule and recomputation that minimise the\n"
                "iteration time under each device's memory. An exact DP (or ILP) solves each candidate for its\n"
                "declared objective; the schedule simulator then scores the best partitions and the best\n"
                "simulated plan wins. Baselines (uniform, by parameters, by time) are scored the same way.\n\n"
                "example:\n"
                "  pipeplan plan gpt2.profile.json --ranks 4 --global-batch 16 --memory 16GiB --out gpt2.plan.json"
            ),
        ),
    ),
    "check": (
        CheckCommand,
        dict(
            help="predict a Megatron-Core, torchtitan or DeepSpeed configuration before it runs, beside the best plan",
            description=(
                "Read the configuration you already run as the trainer reads it (docs/check.md): Megatron-Core's\n"
                "arguments (--pipeline-model-parallel-size/-layout, --decoder-first/last-pipeline-num-layers,\n"
                "--num-layers-per-virtual-pipeline-stage, --tensor-model-parallel-size, batch sizes, recomputation,\n"
                "--use-distributed-optimizer ...), torchtitan's --section.key overrides or TOML\n"
                "(module_fqns_per_model_part or pipeline_parallel_layers_per_stage, schedule, degrees, batch), or\n"
                "DeepSpeed's ds_config (its pipeline section: stages, partition_method uniform | parameters |\n"
                "type:REGEX, or parts). Build that layout as the trainer would (its rounding and its refusals, in\n"
                "its words; units it would not train are named), predict the step and each rank's memory against\n"
                "its device, and print pipeplan's best plan under the same trainer's rules on the same devices and\n"
                "batch, with its export. Exit 0: every rank fits; 1: some rank would run out of memory (named);\n"
                "2: a configuration that cannot be read or that the trainer would refuse.\n\n"
                "examples:\n"
                "  pipeplan check gpt2.profile.json --from megatron megatron.args --memory 16GiB\n"
                "  pipeplan check llama.profile.json --from torchtitan job.toml --devices 8 \\\n"
                "      --rename model.layers=layers --rename model.embed_tokens=tok_embeddings \\\n"
                "      --rename model.norm=norm\n"
                "  pipeplan check gpt2.profile.json --from deepspeed ds_config.json --out mine.plan.json"
            ),
        ),
    ),
    "tune": (
        TuneCommand,
        dict(
            help="run the planner's best candidates for real, refit the calibration, keep the fastest",
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
        ),
    ),
    "export": (
        ExportOptions,
        dict(
            help="print the plan's layout as torchtitan, Megatron-Core, DeepSpeed or accelerate configuration",
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
        ),
    ),
    "simulate": (
        SimulateOptions,
        dict(
            help="predict an iteration and draw its timeline",
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
        ),
    ),
    "verify": (
        VerifyCommand,
        dict(
            help="run a plan with torch.distributed.pipelining and compare with the prediction",
            description=(
                "Launch the plan's ranks (gloo on CPU, NCCL on GPUs), run warm-up and timed steps, and print the\n"
                "predicted vs measured time per stage and per iteration. Exits 1 when the iteration error exceeds\n"
                "--tolerance. With fewer cores or GPUs than ranks, replay mode runs every stage in one process in\n"
                "the schedule's order and feeds the measured times through the simulator.\n\n"
                "example:\n  pipeplan verify gpt2.plan.json --model gpt2-small --steps 5 --out report.json"
            ),
        ),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from profiles.models import BUILTIN_NAMES

    parser = Parser(prog="pipeplan", description=TOP, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"pipeplan {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (kind, texts) in COMMANDS.items():
        description = texts["description"].replace("{builtins}", ", ".join(BUILTIN_NAMES))
        command = sub.add_parser(name, help=texts["help"], description=description, formatter_class=HelpFormatter)
        add_options(command, kind)
    return parser


def command_options(args: argparse.Namespace) -> object:
    """The parsed command's options dataclass."""
    return options_from(args, COMMANDS[args.command][0])

#!/usr/bin/env bash
# Train with torchtitan 0.3 on a pipeplan plan's stages.
#
#   examples/torchtitan/train.sh PLAN.json MODULE CONFIG [your torchtitan flags...]
#
# e.g. a plan made from transformers' Llama 3 8B (examples/llama-8b.json), trained as torchtitan's llama3_8b:
#
#   pipeplan profile hf:examples/llama-8b.json --seq-len 128 --sample-blocks --out llama8b.profile.json
#   pipeplan plan llama8b.profile.json --stages 4 --global-batch 32 --out llama8b.plan.json
#   examples/torchtitan/train.sh llama8b.plan.json llama3 llama3_8b --training.steps 10
#
# A model whose head shares the embedding's weight (Llama 3.2 1B/3B) is refused by torchtitan 0.3 under
# pipeline parallelism: take it untied from examples/torchtitan/config_registry.py, e.g.
#   examples/torchtitan/train.sh llama3b.plan.json examples.torchtitan.config_registry llama3_2_3b_untied
# (from the repository's root, so that Python finds the module).
#
# The plan names transformers' modules; --rename maps them onto torchtitan's (its head is lm_head in both).
# The export's flags come after yours: its last word, activation-checkpoint:..., must be last.
set -euo pipefail
plan=$1 module=$2 config=$3
shift 3

# The export's words as a shell reads them (comments dropped, continuations joined), one per line.
words() { python -c 'import shlex, sys; print(*shlex.split(sys.stdin.read().replace("\\\n", " "), comments=True), sep="\n")'; }
mapfile -t flags < <(
    pipeplan export "$plan" --to torchtitan --rename model.embed_tokens=tok_embeddings \
        --rename model.layers=layers --rename model.norm=norm | words
)

# Processes: pp x dp for a cluster plan, else pp. And, where the plan puts each pipeline on consecutive
# devices, the RANK torchtitan must see on each (its mesh is pp-major): empty when torchrun's own will do.
read -r nproc ranks < <(python -c '
import sys
from planner.export import rank_of_device
from planner.plan import load_plan
plan = load_plan(sys.argv[1])
print(plan.mesh.used_devices if plan.mesh else plan.num_ranks, *rank_of_device(plan))' "$plan")

args=(--module "$module" --config "$config" "$@" "${flags[@]}")
if [ -z "$ranks" ]; then
    exec torchrun --nproc-per-node "$nproc" -m torchtitan.train "${args[@]}"
fi
# Across nodes, run this on each with torchrun's --nnodes/--node-rank/--rdzv-* options added.
export PLAN_RANKS="$ranks"
exec torchrun --nproc-per-node "$nproc" --no-python bash -c \
    'r=($PLAN_RANKS); export RANK=${r[$RANK]}; exec python -m torchtitan.train "$@"' bash "${args[@]}"

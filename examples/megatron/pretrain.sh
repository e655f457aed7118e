#!/usr/bin/env bash
# Pretrain with Megatron-LM (megatron-core 0.16-0.19) on a pipeplan plan's layout.
#
#   MEGATRON=/path/to/Megatron-LM examples/megatron/pretrain.sh PLAN.json [your pretrain_gpt.py flags...]
#
# e.g. a plan of a GPT model with 24 decoder layers on 4 pipeline ranks:
#
#   pipeplan plan gpt.profile.json --stages 4 --global-batch 64 --out gpt.plan.json
#   MEGATRON=~/Megatron-LM examples/megatron/pretrain.sh gpt.plan.json --hidden-size 1024 \
#       --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 --train-iters 100 ...
#
# The export gives --pipeline-model-parallel-size and --pipeline-model-parallel-layout (which sets the
# virtual pipeline size: add no --num-virtual-stages-per-pipeline-rank), --num-layers, the batch sizes and,
# for a cluster plan, --use-distributed-optimizer and the rank order (--use-tp-pp-dp-mapping). Your flags
# give the rest: the model's width, data, optimizer. megatron-core 0.19 needs Python >= 3.12.
set -euo pipefail
plan=$1
shift

# The export's words as a shell reads them (comments dropped, continuations joined, quotes removed).
words() { python -c 'import shlex, sys; print(*shlex.split(sys.stdin.read().replace("\\\n", " "), comments=True), sep="\n")'; }
mapfile -t flags < <(pipeplan export "$plan" --to megatron | words)
nproc=$(python -c '
import sys
from planner.plan import load_plan
plan = load_plan(sys.argv[1])
print(plan.mesh.used_devices if plan.mesh else plan.num_ranks)' "$plan")

# Across nodes, run this on each with torchrun's --nnodes/--node-rank/--rdzv-* options added.
exec torchrun --nproc-per-node "$nproc" "${MEGATRON:?set MEGATRON to a Megatron-LM checkout}/pretrain_gpt.py" \
    "$@" "${flags[@]}"

#!/bin/bash
# vit-ft's GPU check: offline, at most 9 minutes on one H100 with 16 cores, from a clean copy of the repository
# plus the wheels a GPU image lacks. One line, from the repository root:
#   OUT=/tmp/gpu-check bash scripts/gpu_check.sh            # --cpu (or GPU_CHECK_CPU=1): every step tiny, on a CPU
# Writes $OUT/summary.md (one line per step: ok or failed, its time, its key figure) and each step's log beside it;
# exits 0 when every step is ok, 1 when one failed (the later steps still run), 2 when the set-up is missing.
# Steps, each under its own `timeout` (seconds, GPU mode):
#   env      30   the wheels in wheels/ installed (pip --no-index --no-deps --target, never torch); the modules a
#                 fine-tune imports (one line naming a missing one, exit 2); versions, GPU, cores, /dev/shm
#   data     25   a random ViT-B/16 (224 px, as the in21k checkpoint) and 20 classes x 200 synthetic 500x375 JPEGs
#   loader   30   the fine-tune's worker path (decode + crop to uint8) at 384 px with 8 and 14 DataLoader workers
#   dogs    120   `--recipe dogs` as written (bf16, 384 px, 32 per device, global batch 512 = 16 accumulation
#                 steps, 8 workers) for 80 steps (1,280 micro-batches) on those JPEGs; GPU memory and utilisation
#                 sampled by nvidia-smi every 0.5 s
#   resume   50   checkpoint-70 copied to a fresh folder and --resume'd to step 80: the last loss against dogs'
#   compile 125   torch.compile + EMA + fused AdamW + tf32 + gradient checkpointing, 40 steps of batch 32
#   bench   140   scripts/bench.py --sections gpu: ours against transformers' ViT (and timm's where installed),
#                 eager and compiled, inference and training step, model FLOP utilisation
# The GPU image has torch (CUDA), transformers, accelerate, peft, torchvision, timm, pyarrow, huggingface_hub but
# not datasets, evaluate or kornia: download their wheels (22 MB, the versions this project is tested with) on a
# machine with the network, into wheels/ at the repository root, and carry that folder with the copy:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d wheels \
#     datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 evaluate==0.4.6 kornia==0.9.0 \
#     kornia_rs==0.2.0 transformers==5.24.0
# (--python-version: the image's Python; keep wheels/ out of git, e.g. in .git/info/exclude.) Should the env line
# name another module (scikit-learn, matplotlib: most images have them), download its wheel the same way.
# Settings: PY (the Python, python3), GPU_CHECK_WORK (scratch, emptied first: /tmp/vit-ft-gpu-check),
# GPU_CHECK_WHEELS (wheels). The limits, with 20 s for installing the wheels, add up to 9 minutes (x3 in the CPU
# mode: a busy 2-core machine); a step past its limit is stopped (SIGTERM, then SIGKILL 10 s later), its line says so.
set -u
cd "$(dirname "$0")/.." || exit 2
CPU=${GPU_CHECK_CPU:-0}
for arg in "$@"; do
  case $arg in
    --cpu) CPU=1 ;;
    *) echo "gpu_check: unknown argument '$arg'; the only one is --cpu (every step tiny, on a CPU)" >&2; exit 2 ;;
  esac
done
PY=${PY:-python3}
OUT=$(mkdir -p "${OUT:-outputs/gpu-check}" && cd "${OUT:-outputs/gpu-check}" && pwd)
W=${GPU_CHECK_WORK:-/tmp/vit-ft-gpu-check}
WHEELS=${GPU_CHECK_WHEELS:-wheels}
rm -rf "$W" && mkdir -p "$W" || exit 2
SUMMARY=$OUT/summary.md
export PYTHONPATH=$PWD:$W/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VIT_FT_RECIPES_DIR=$PWD/recipes
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TQDM_DISABLE=1

if [ "$CPU" = 1 ]; then
  MODE="CPU mode (tiny)"; DEVICE="--gpu-device cpu --quick --rounds 2"; STEPS=6; SAVE=4; PER_CLASS=10; SIZE=32
  WORKERS="1 2"; BATCHES=4; TF32=""; SCALE=3
  TINY="--image_size 32 --use_cpu true --bf16 false --per_device_train_batch_size 4 --global_batch_size 8
        --per_device_eval_batch_size 8 --dataloader_num_workers 1 --logging_steps 1 --torch_compile_backend eager"
else
  MODE="GPU mode"; DEVICE="--rounds 3"; STEPS=80; SAVE=70; PER_CLASS=200; SIZE=384
  WORKERS="8 14"; BATCHES=40; TF32="--tf32 true"; TINY=""; SCALE=1
fi
FAILED=0
printf '# GPU check, %s, %s\n\n' "$MODE" "$(date -u '+%Y-%m-%d %H:%M UTC')" > "$SUMMARY"

# step NAME SECONDS FIGURE_COMMAND -- COMMAND...: COMMAND under `timeout`, its output in $OUT/NAME.log; then one
# summary line: ok with FIGURE_COMMAND's output, or failed with the exit status and the log's last line
step() {
  local name=$1 seconds=$(($2 * SCALE)) figure=$3 start status line figures why
  shift 4
  start=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" > "$OUT/$name.log" 2>&1
  status=$?
  if [ $status = 0 ]; then
    figures=$(eval "$figure" 2>&1)
    line="- $name: ok in $((SECONDS - start)) s: ${figures//$'\n'/; }"
  else
    FAILED=1
    case $status in 124|137) why="timed out after $seconds s" ;; *) why="exit $status" ;; esac
    line="- $name: failed ($why, see $name.log): $(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-300)"
  fi
  echo "$line" | tee -a "$SUMMARY"
}

# GPU memory and utilisation every 0.5 s while a step runs (nothing on a machine without nvidia-smi)
sample_gpu() {
  command -v nvidia-smi > /dev/null || return 0
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,nounits -lms 500 > "$OUT/$1.gpu.csv" 2> /dev/null &
  SAMPLER=$!
}
stop_sampling() { [ -n "${SAMPLER:-}" ] && kill "$SAMPLER" 2> /dev/null; SAMPLER=""; }
trap stop_sampling EXIT

# env: the wheels, then the modules; a missing one ends the check here with one line
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  if compgen -G "$WHEELS/torch-*.whl" > /dev/null; then
    echo "gpu_check: $WHEELS/ holds a torch wheel; remove it: the image's own CUDA build of torch must stay" | tee -a "$SUMMARY" >&2
    exit 2
  fi
  if ! timeout 20 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$WHEELS"/*.whl > "$OUT/wheels.log" 2>&1; then
    echo "gpu_check: installing $WHEELS/*.whl failed: $(tail -n 1 "$OUT/wheels.log")" | tee -a "$SUMMARY" >&2
    exit 2
  fi
fi
step env 30 "tail -n 1 '$OUT/env.log'" -- "$PY" benchmarks/gpu_check.py env
if [ "$FAILED" = 1 ]; then
  tail -n 1 "$OUT/env.log" >&2
  exit 2
fi

step data 25 "tail -n 1 '$OUT/data.log'" -- "$PY" benchmarks/gpu_check.py data "$W" --per-class "$PER_CLASS" $([ "$CPU" = 1 ] && echo --cpu)
step loader 30 "tail -n 1 '$OUT/loader.log'" -- "$PY" benchmarks/gpu_check.py loader "$W" "$SIZE" $WORKERS --batches "$BATCHES"

FINETUNE=("$PY" -m accelerate.commands.launch --config_file recipes/accelerate_configs/single_gpu.yaml scripts/finetune.py
          --recipe dogs --model_name_or_path "$W/vit" --train_dir "$W/data/train" --test_dir "$W/data/test"
          --report_to none --max_steps "$STEPS" --save_steps "$SAVE" --eval_steps "$SAVE")
# shellcheck disable=SC2206  # TINY is words
FINETUNE+=($TINY)
sample_gpu dogs
step dogs 120 "$PY benchmarks/gpu_check.py figure run '$W/dogs'; $PY benchmarks/gpu_check.py figure gpu '$OUT/dogs.gpu.csv'" \
  -- "${FINETUNE[@]}" --output_dir "$W/dogs"
stop_sampling

mkdir -p "$W/resumed" && cp -r "$W/dogs/checkpoint-$SAVE" "$W/resumed/" 2> /dev/null
step resume 50 "$PY benchmarks/gpu_check.py figure resume '$W/resumed' '$W/dogs'" \
  -- "${FINETUNE[@]}" --output_dir "$W/resumed" --resume

sample_gpu compile
# shellcheck disable=SC2086  # TF32 is words
step compile 125 "$PY benchmarks/gpu_check.py figure run '$W/compiled'; $PY benchmarks/gpu_check.py figure gpu '$OUT/compile.gpu.csv'" \
  -- "${FINETUNE[@]}" --output_dir "$W/compiled" --max_steps $((STEPS / 2)) --eval_strategy no --save_strategy no \
  --global_batch_size "$([ "$CPU" = 1 ] && echo 4 || echo 32)" --torch_compile true --ema_decay 0.999 \
  --optim adamw_torch_fused --learning_rate 1e-4 --gradient_checkpointing true $TF32
stop_sampling

# shellcheck disable=SC2086  # DEVICE is words
step bench 140 "$PY benchmarks/gpu_check.py figure bench '$OUT/bench/benchmark.json'" \
  -- "$PY" scripts/bench.py --sections gpu $DEVICE --output-dir "$OUT/bench"

echo "Summary: $SUMMARY"
exit "$FAILED"

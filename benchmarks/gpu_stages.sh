#!/bin/bash
# Train several recipes side by side on one GPU (three of the tiny model at batch 128-512 kept one
# H200 99-100% busy), each fitted to FIT minutes (stopped at MAX), then pack each export into $OUT
# for the trip back: NAME.tar.part00, part01, ... (15 MB parts; `cat NAME.tar.part* | tar -x`), and
# logs.tar.
# Usage (on the device machine, from the repo root): benchmarks/gpu_stages.sh RECIPE.json...
# On this workplace's H200 (BENCHMARKS.md, "Stage 19 on one H200"): the tree that travels must stay
# under 64 MiB, so take checkpoints/ out of the index for the call (git rm -r -q checkpoints; after:
# git reset -q -- checkpoints && git checkout -- checkpoints), and carry wheels of the pinned
# transformers and of pydantic (with its dependencies), which the image lacks, in WHEELS.
# Env: DEVICE (cuda), INIT (when set, the checkpoint every recipe starts from instead of its own
# model.init, which must otherwise travel too), FIT, MAX (minutes),
# WHEELS (a folder of wheels to install first), OUT (where the packs go).
set -u
DEVICE=${DEVICE:-cuda}; FIT=${FIT:-5.5}; MAX=${MAX:-6.8}
init=(); [ -n "${INIT:-}" ] && init=(--init "$INIT")
OUT=${OUT:?set OUT}
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
PY=${PY:-python3}
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p /tmp/gpu_logs
sampler=
if [ "$DEVICE" = cuda ]; then  # GPU load every 30 s, for the record
  (while sleep 30; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; done) \
    > /tmp/gpu_logs/util.log 2>&1 < /dev/null &
  sampler=$!
fi
names=(); dirs=(); pids=()
for recipe in "$@"; do
  read -r name dir < <($PY -c "import sys; from clover.training.recipe import load_recipe
r = load_recipe(sys.argv[1]); print(r.name, r.output_dir)" "$recipe")
  $PY -m clover.cli.main train "$recipe" "${init[@]}" --device "$DEVICE" --fit-minutes "$FIT" \
    --max-minutes "$MAX" --no-progress > /tmp/gpu_logs/$name.out 2>&1 &
  names+=("$name"); dirs+=("$dir"); pids+=($!)
  echo "started $name pid $!"
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; echo "${names[$i]} exit $? at $(date +%T)"
done
[ -n "$sampler" ] && kill "$sampler"
for i in "${!names[@]}"; do
  name=${names[$i]}; dir=${dirs[$i]}
  tail -n 4 /tmp/gpu_logs/$name.out
  for file in train.log fit.json metrics.jsonl; do cp "$dir/$file" "/tmp/gpu_logs/$name.$file" 2>/dev/null; done
  [ -d "$dir/final" ] || continue
  tar -cf - -C "$dir" final recipe.json | split -b 15000000 -d - "$OUT/$name.tar.part"
done
tar -cf "$OUT/logs.tar" -C /tmp gpu_logs
ls -la "$OUT"

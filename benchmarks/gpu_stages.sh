#!/bin/bash
# Train several recipes side by side on one GPU (three of the tiny model at batch 128-512 kept one
# H200 99-100% busy), each fitted to FIT minutes (stopped at MAX), then pack each export into $OUT
# for the trip back: NAME.tar.part00, part01, ... (15 MB parts; `cat NAME.tar.part* | tar -x`), and
# logs.tar.
# Usage (on the device machine, from the repo root): benchmarks/gpu_stages.sh LANE...
# A lane is one recipe, or a chain of stages run one after another, `A.json@0.8,B.json@2.5`, each
# stage fitted to the minutes after its @ (FIT when none) and stopped at SLACK times them (MAX when
# none); a stage's model.init names the run dir of the stage before it. Lanes run side by side; each
# lane's last stage that finished is packed.
# On this workplace's H200 (BENCHMARKS.md, "Stage 19 on one H200"): the tree that travels must stay
# under 64 MiB, so take checkpoints/ out of the index for the call (git rm -r -q checkpoints; after:
# git reset -q -- checkpoints && git checkout -- checkpoints), and carry wheels of the pinned
# transformers and of pydantic (with its dependencies), which the image lacks, in WHEELS.
# Env: DEVICE (cuda), INIT (when set, the checkpoint every lane's first stage starts from instead of
# its own model.init, which must otherwise travel too), FIT, MAX (minutes, per stage), SLACK (1.25),
# WHEELS (a folder of wheels to install first), OUT (where the packs go).
set -u
DEVICE=${DEVICE:-cuda}; FIT=${FIT:-5.5}; MAX=${MAX:-6.8}; SLACK=${SLACK:-1.25}
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
recipe_field() {  # name or output_dir of a recipe (JSON or YAML)
  $PY -c "import sys; from clover.training.recipe import load_recipe
print(getattr(load_recipe(sys.argv[1]), sys.argv[2]))" "$1" "$2"
}
run_lane() {  # the stages of lane $1 one after another, until one fails; "NAME DIR" of each done
  local first=1 stage recipe minutes max name dir stage_init rc
  for stage in ${1//,/ }; do
    recipe=${stage%@*}; minutes=$FIT; max=$MAX
    [ "$stage" != "$recipe" ] && minutes=${stage#*@} && max=$(awk "BEGIN {print $minutes * $SLACK}")
    name=$(recipe_field "$recipe" name); dir=$(recipe_field "$recipe" output_dir)
    stage_init=(); [ $first = 1 ] && stage_init=("${init[@]}"); first=0
    echo "$(date +%T) $name: $minutes minutes, at most $max" >&2
    $PY -m clover.cli.main train "$recipe" "${stage_init[@]}" --device "$DEVICE" --fit-minutes "$minutes" \
      --max-minutes "$max" --no-progress > /tmp/gpu_logs/$name.out 2>&1
    rc=$?
    for file in train.log fit.json metrics.jsonl; do cp "$dir/$file" "/tmp/gpu_logs/$name.$file" 2>/dev/null; done
    tail -n 4 /tmp/gpu_logs/$name.out >&2
    [ $rc = 0 ] && [ -d "$dir/final" ] || { echo "$(date +%T) $name exit $rc" >&2; return 1; }
    echo "$name $dir"
  done
}
lanes=(); pids=()
for lane in "$@"; do
  lanes+=("/tmp/gpu_logs/lane${#lanes[@]}")
  run_lane "$lane" > "${lanes[-1]}.done" 2> "${lanes[-1]}.log" &
  pids+=($!)
  echo "started lane $lane pid $!"
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; echo "lane $i exit $? at $(date +%T)"; cat "${lanes[$i]}.log"
done
[ -n "$sampler" ] && kill "$sampler"
for lane in "${lanes[@]}"; do  # each lane's last stage that finished
  read -r name dir < <(tail -n 1 "$lane.done")
  [ -n "${name:-}" ] || continue
  tar -cf - -C "$dir" final recipe.json | split -b 15000000 -d - "$OUT/$name.tar.part"
done
tar -cf "$OUT/logs.tar" -C /tmp gpu_logs
ls -la "$OUT"

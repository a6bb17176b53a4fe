#!/usr/bin/env bash
# The next lent GPU window's one script: issue 37's study and MFU checks and issue 41's
# dense step timed on the GPU, about 8 minutes expected, 9.5 at most (its parts capped at
# 4, 2.5, 2 and 1.3 minutes, the least needed last), so that a 15-minute window has room to
# rerun a part. Run it with timeout_s 600.
# Carry .whl (bench/gpu_wheels.sh) and run from the repository root there:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \
#       bash bench/gpu_window.sh "$OUT"
# 1. The quickstart's search phase, 1 and 8 workers, 120 trials each, MPS on for both
#    (BENCHMARKS.md, "GPU studies, second window": the check left for this window).
# 2. The MLPerf shape at 16,384 (MFU): the compiled step with the network's inputs cast to
#    bf16 under autocast (`builder.AUTOCAST_INPUTS`, new) and left in fp32 (as before; the
#    cross layers' bias is in the product in both), then a profile of the compiled step
#    (its tables in "$out/mfu.txt").
# 3. What bounds the 8 workers: 1 and 8 processes training dcnv2 at 512 side by side under
#    MPS with no study around them (`--parts concurrent`). Summed examples/s near 8x one
#    alone: the study's host work bounds it; far below: the GPU's sharing of small kernels.
#    (It replaces the forked-against-spawned workers' run, which saves start-up only.)
# 4. The co-design schema's dense step timed on the GPU for 100 architectures around DLRM
#    and DCNv2: the predictor `bench/codesign_gpu_dense.yaml` uses, so that a study on this
#    CPU predicts the step of a 16-GPU cluster with a GPU's dense part (issue 41).
set -uo pipefail
out=${1:?usage: bench/gpu_window.sh OUT_DIR}
mkdir -p "$out"
# Bytecode first: the wheels go in with --no-compile, and in the second window every worker
# compiled ~4,400 modules at start-up (8.3 s of one worker's profile, 90 s over eight),
# which a user's pip install never does.
python3 -m compileall -q -j 0 /tmp/site nas search_space trainers cost_models mlflow_server \
    > /dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
# Workers are forked from a server that imported the trainer (nas/launch.py); bench_gpu.py
# first checks that a forked worker can use CUDA, else starts each afresh (spawn).
timeout 240 python3 bench/bench_gpu.py --suite study --device cuda --parts study \
    --rows 200000 --workers 1,8 --study-trials 120 --mps --out "$out/study.json" \
    2>&1 | tail -n 40
timeout 150 python3 bench/bench_gpu.py --suite study --device cuda --parts profile,steps \
    --step-models "" --ways compile,compile-fp32in --rows 200000 --repeats 3 \
    --out "$out/mfu.json" 2>&1 | tee "$out/mfu.txt" | grep -E "^\||^###|rror" | tail -n 20
# 1 and 8 processes training side by side, no study: what the GPU gives 8 at once
timeout 120 python3 bench/bench_gpu.py --suite study --device cuda --parts concurrent \
    --rows 200000 --workers 1,8 --steps 2000 --mps --out "$out/concurrent.json" \
    2>&1 | grep -E "^concurrent|rror" | tail -n 10
timeout 80 python3 bench/bench_latency.py --config bench/codesign.yaml --bases dlrm,dcnv2 \
    --archs 50 --device cuda --save "$out/dense_step_codesign_gpu.json" 2>&1 | tail -n 20

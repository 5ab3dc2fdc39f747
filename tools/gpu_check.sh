#!/usr/bin/env bash
# tools/gpu_check.sh — every check of the CUDA backend that needs an NVIDIA GPU, in one non-interactive run
# (about 7-8 minutes on an H200; at most LLAISYS_GPU_CHECK_BUDGET seconds, 470 by default), ending with a summary:
#   1. build llaisys-backend-cuda for this GPU only (LLAISYS_CUDA_ARCHS from nvidia-smi) and install the stack
#   2. the op tests and the backend's package tests on cuda      (pytest tests/ops tests/core ... --backend=cuda):
#      the tensor-core linear's rows bit for bit across M, linear_i8 against its exact arithmetic, the sampler
#   3. benchmarks/linear_gpu.py: the default (tensor-core) linear's rows at M = 1, 7, 64 against M = 512 bit for
#      bit and against torch's f32 product; then µs per call against torch (cuBLAS) at the 1.5B shapes, with
#      linear_i8 beside it, and the same timings for the SIMT kernel (LLAISYS_CUDA_LINEAR_SIMT=1) at decode sizes
#   4. benchmarks/e2e.py --device cuda --profile on the Qwen2-1.5B-shaped random model: HF transformers eager, HF
#      with a static cache and a compiled decode step (gpt-fast style), llaisys (decode graphs), llaisys eager
#      (LLAISYS_GRAPHS=0) and llaisys int8 — prefill tok/s at 16 and 512 tokens, decode tok/s, 16 sequences
#      decoded at once against one, peak device memory — then one eager decode step op by op (llaisys.profile:
#      each op timed to its end, a synchronize after each)
#   5. benchmarks/tp.py: the 1.5B model split over the GPUs (TP = as many as it splits over, at most all of
#      them) against one GPU; with one GPU, TP=1 through an NCCL communicator of one (NCCL from the
#      nvidia-nccl-cu13 wheel, installed in stage 1)
#   6. model parity on cuda against HF transformers, tests/models/test_tensor_parallel.py included
#                                                                  (pytest tests/models --backend=cuda)
# Each stage has its own time limit, cut to what is left of the budget; a failed or cut stage is reported and the
# next one still runs (a stage that would get less than its minimum is skipped, and says so).
#
#   tools/gpu_check.sh [--llama-bench PATH --gguf LABEL=FILE ...] [WORKDIR]     (default WORKDIR: /tmp/llaisys-gpu-check)
#
# --llama-bench PATH: llama.cpp's llama-bench built with CUDA for this GPU; each --gguf LABEL=FILE (the same model
#                     converted, e.g. bf16=qwen2-1.5b-bf16.gguf from convert_hf_to_gguf.py --outtype bf16) adds a
#                     "llama.cpp LABEL" column to the e2e table. Without them the table has no llama.cpp column.
# Environment: PYTHON (default python3); PIP_ARGS;
#   LLAISYS_GPU_CHECK_VENV=path  reuse this venv instead of making one. A new one sees the packages of the
#                                Python that made it (torch's CUDA build), also when that Python is itself a
#                                venv's, through a .pth file (--system-site-packages alone would skip them);
#   LLAISYS_GPU_CHECK_WHEELS=dir install the llaisys wheels (and any other *.whl) in dir, built elsewhere with
#                                LLAISYS_CUDA_ARCHS naming this GPU, instead of building here (offline machines);
#   LLAISYS_GPU_CHECK_LOG=dir    write the stage logs there (default WORKDIR/log);
#   LLAISYS_GPU_CHECK_BUDGET=s   the whole run's wall-clock budget in seconds (default 470).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LLAMA_BENCH=""
declare -a GGUF_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --llama-bench) LLAMA_BENCH="$2"; shift 2 ;;
        --gguf) GGUF_ARGS+=(--gguf "$2"); shift 2 ;;
        -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
        --*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
WORK="${1:-/tmp/llaisys-gpu-check}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$WORK"
LOG="${LLAISYS_GPU_CHECK_LOG:-$WORK/log}"
mkdir -p "$LOG"
START=$(date +%s)
BUDGET="${LLAISYS_GPU_CHECK_BUDGET:-470}"
declare -a ROWS=()

row() { ROWS+=("$(printf '%-28s %-6s %6ss  %s' "$1" "$2" "$3" "$4")"); }
left() { echo $((BUDGET - ($(date +%s) - START))); }

# stage NAME LIMIT MIN COMMAND... : runs COMMAND with a time limit (LIMIT, cut to the budget left; skipped when
# less than MIN is left), logs it, records a row
stage() {
    local name="$1" limit="$2" min="$3"; shift 3
    local t0=$SECONDS log="$LOG/${name//[^A-Za-z0-9_.-]/_}.log" remaining
    remaining=$(left)
    if [ "$remaining" -lt "$min" ]; then
        row "$name" SKIP 0 "budget: ${remaining}s left of ${BUDGET}s, the stage needs ${min}s"
        echo "== $name: skipped (budget)" | tee "$log"
        return 3
    fi
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    echo "== $name (limit ${limit}s): $*" | tee "$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$? detail
    detail="$(grep -E '[0-9]+ (passed|failed)|error|PASS|FAIL' "$log" | tail -1 | cut -c1-90)"
    [ $rc -eq 124 ] && detail="timed out after ${limit}s; $detail"
    if [ $rc -eq 0 ]; then row "$name" ok $((SECONDS - t0)) "$detail"
    else row "$name" FAIL $((SECONDS - t0)) "exit $rc: ${detail:-see $log}"; tail -20 "$log"; fi
    return $rc
}

# ---- 0. the GPU ----------------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi fails): nothing to check" >&2
    exit 2
fi
GPU="$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -1)"
CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
export LLAISYS_CUDA_ARCHS="${LLAISYS_CUDA_ARCHS:-$CAP}"
echo "GPU: $GPU -> LLAISYS_CUDA_ARCHS=$LLAISYS_CUDA_ARCHS"

# ---- 1. build and install ------------------------------------------------------------------------------
VENV="${LLAISYS_GPU_CHECK_VENV:-$WORK/venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # the making Python's own site-packages (a venv's, where torch often lives) stay visible in the new venv
    "$PYTHON" -c "import site; print('\n'.join(site.getsitepackages()))" \
        >"$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")/_llaisys_gpu_check_parent.pth"
fi
PY="$VENV/bin/python"
cd "$ROOT"
if [ -n "${LLAISYS_GPU_CHECK_WHEELS:-}" ]; then
    stage "install wheels" 120 10 "$PY" -m pip install -q --no-deps --no-index --force-reinstall ${PIP_ARGS:-} \
        "$LLAISYS_GPU_CHECK_WHEELS"/*.whl
else
    PACKAGES="$ROOT/llaisys-core $ROOT/llaisys-backend-cpu $ROOT/llaisys-models $ROOT/llaisys-backend-cuda[nccl]"
    # online: build isolation fetches the CUDA wheels only if no toolkit is installed; offline: the installed
    # toolkit (CUDA_HOME / nvcc) and what the venv already has
    stage "build + install" 300 60 bash -c "'$PY' -m pip install -q ${PIP_ARGS:-} $PACKAGES -r '$ROOT/tests/requirements.txt' ||
        '$PY' -m pip install -q --no-build-isolation --no-deps ${PIP_ARGS:-} $PACKAGES"
fi
stage "cuda visible" 60 10 "$PY" -c "
import llaisys, sys
print(llaisys.available_devices())
import llaisys_backend_cuda.plugin as p
lib = p.load()
print(lib.lib.api_version, [r for r in llaisys.backend_report() if r.name == 'cuda'])
print('linear_i8 on cuda:', llaisys.ops.implemented('linear_i8', 'cuda'))
sys.exit(0 if any(d.type == 'cuda' for d in llaisys.available_devices()) else 1)"

# the benchmark's model is written on the CPU while the tests and the linear benchmark run (it needs no GPU)
MODEL="$WORK/qwen2-1.5b-random"
MODEL_T0=$SECONDS
[ -f "$MODEL/config.json" ] || timeout 200 "$PY" benchmarks/make_model.py --out "$MODEL" >"$LOG/make_model.log" 2>&1 &
MAKE_MODEL=$!

# ---- 2. op tests on cuda -------------------------------------------------------------------------------
PYTEST=("$PY" -m pytest -q -rfE --durations=10 -p no:cacheprovider --backend=cuda)
stage "op tests (cuda)" 170 60 "${PYTEST[@]}" tests/ops tests/core tests/backends/test_abi.py \
    tests/backends/test_graphs.py tests/backends/cuda/test_package.py

# ---- 3. the linears: batch invariance on the GPU, then their speed ---------------------------------------
stage "linear: invariance + speed" 120 30 "$PY" benchmarks/linear_gpu.py
LINEAR="$LOG/linear__invariance___speed.log"
stage "linear: SIMT kernel" 60 15 env LLAISYS_CUDA_LINEAR_SIMT=1 "$PY" benchmarks/linear_gpu.py --no-check --no-int8 \
    --rows 1,4,16
SIMT="$LOG/linear__SIMT_kernel.log"

# ---- 4. end to end against HF (eager, and static cache + torch.compile) on the same GPU -----------------
if wait "$MAKE_MODEL"; then row "make 1.5B model (beside)" ok $((SECONDS - MODEL_T0)) "$MODEL"
else row "make 1.5B model (beside)" FAIL $((SECONDS - MODEL_T0)) "see $LOG/make_model.log"; fi
E2E_ARGS=(--model "$MODEL" --device cuda --decode-tokens 64 --streams 16 --profile)
[ -n "$LLAMA_BENCH" ] && E2E_ARGS+=(--llama-bench "$LLAMA_BENCH" "${GGUF_ARGS[@]}")
stage "e2e benchmark" 260 90 "$PY" benchmarks/e2e.py "${E2E_ARGS[@]}"
E2E="$LOG/e2e_benchmark.log"

# ---- 5. tensor parallelism over NCCL -------------------------------------------------------------------
NGPU="$(nvidia-smi -L | wc -l)"
if [ "$NGPU" -ge 2 ]; then TP_ARGS=(--device cuda); else TP_ARGS=(--device cuda --tensor-parallel 1 --through-communicator); fi
stage "tensor parallel ($NGPU GPU)" 120 45 "$PY" benchmarks/tp.py --model "$MODEL" --rounds 2 --decode-tokens 64 "${TP_ARGS[@]}"
TP="$LOG/tensor_parallel__${NGPU}_GPU_.log"

# ---- 6. model parity (last: what is left of the budget) ------------------------------------------------
stage "model parity (cuda)" 180 45 "${PYTEST[@]}" tests/models

# ---- summary (last) ------------------------------------------------------------------------------------
echo
echo "llaisys GPU check — $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "GPU: $GPU, archs $LLAISYS_CUDA_ARCHS, total $((($(date +%s) - START)))s of a ${BUDGET}s budget"
echo "llaisys column: decode steps replayed from CUDA graphs; eager column: LLAISYS_GRAPHS=0"
printf '%-28s %-6s %7s  %s\n' stage status time detail
for r in "${ROWS[@]}"; do echo "$r"; done
if [ -f "$E2E" ] && grep -q "^model " "$E2E"; then
    echo
    sed -n '/^model /,$p' "$E2E"
elif [ -f "$E2E" ] && grep -q "^engine " "$E2E"; then  # cut short: the engines that finished
    echo
    grep "^engine " "$E2E" | cut -c1-400
fi
if [ -f "$TP" ] && grep -q "^configuration" "$TP"; then
    echo
    sed -n '/^configuration/,$p' "$TP"
fi
if [ -f "$LINEAR" ] && grep -q "llaisys us" "$LINEAR"; then
    echo
    grep "^batch invariance" "$LINEAR"
    echo "linear, bf16 (ratio = torch / llaisys; int8: linear_i8 on the same weights quantized):"
    sed -n '/llaisys us/,$p' "$LINEAR"
fi
if [ -f "$SIMT" ] && grep -q "llaisys us" "$SIMT"; then
    echo
    echo "linear, bf16, the SIMT kernel (LLAISYS_CUDA_LINEAR_SIMT=1) at decode sizes:"
    sed -n '/llaisys us/,$p' "$SIMT"
fi

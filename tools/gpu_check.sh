#!/usr/bin/env bash
# tools/gpu_check.sh — every check of the CUDA backend that needs an NVIDIA GPU, in one non-interactive run
# (about 3 minutes on an H200), ending with a summary table:
#   1. build llaisys-backend-cuda for this GPU only (LLAISYS_CUDA_ARCHS from nvidia-smi) and install the stack
#   2. the op tests and the backend's package tests on cuda      (pytest tests/ops tests/backends/cuda --backend=cuda)
#   3. model parity on cuda against HF transformers               (pytest tests/models --backend=cuda)
#   4. benchmarks/e2e.py --device cuda on the Qwen2-1.5B-shaped random model: HF transformers (torch on the
#      same GPU, bf16, eager) vs llaisys with and without decode graph replay (LLAISYS_GRAPHS=0) — prefill
#      tok/s at 16 and 512 tokens, decode tok/s, peak device memory
#   5. benchmarks/linear_gpu.py: the batch-invariant linear against torch's (cuBLAS) at the model's shapes
#   6. benchmarks/tp.py: the 1.5B model split over the GPUs (TP = as many as it splits over, at most all of
#      them) against one GPU; with one GPU, TP=1 through an NCCL communicator of one. Stage 3 also runs
#      tests/models/test_tensor_parallel.py on cuda (NCCL from the nvidia-nccl-cu13 wheel, installed in stage 1)
# Each stage has its own time limit; a failed stage is reported and the next one still runs.
#
#   tools/gpu_check.sh [WORKDIR]        (default WORKDIR: /tmp/llaisys-gpu-check)
# Environment: PYTHON (default python3); PIP_ARGS;
#   LLAISYS_GPU_CHECK_VENV=path  reuse this venv instead of making one. A new one sees the packages of the
#                                Python that made it (torch's CUDA build), also when that Python is itself a
#                                venv's, through a .pth file (--system-site-packages alone would skip them);
#   LLAISYS_GPU_CHECK_WHEELS=dir install the llaisys wheels (and any other *.whl) in dir, built elsewhere with
#                                LLAISYS_CUDA_ARCHS naming this GPU, instead of building here (offline machines);
#   LLAISYS_GPU_CHECK_LOG=dir    write the stage logs there (default WORKDIR/log).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/llaisys-gpu-check}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$WORK"
LOG="${LLAISYS_GPU_CHECK_LOG:-$WORK/log}"
mkdir -p "$LOG"
START=$(date +%s)
declare -a ROWS=()

row() { ROWS+=("$(printf '%-28s %-6s %6ss  %s' "$1" "$2" "$3" "$4")"); }

# stage NAME LIMIT_S COMMAND... : runs COMMAND with a time limit, logs it, records a row
stage() {
    local name="$1" limit="$2"; shift 2
    local t0=$SECONDS log="$LOG/${name//[^A-Za-z0-9_.-]/_}.log"
    echo "== $name (limit ${limit}s): $*" | tee "$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$? detail
    detail="$(grep -E '[0-9]+ (passed|failed)|error' "$log" | tail -1 | cut -c1-90)"
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
if [ -n "${LLAISYS_GPU_CHECK_WHEELS:-}" ]; then
    stage "install wheels" 120 "$PY" -m pip install -q --no-deps --no-index --force-reinstall ${PIP_ARGS:-} \
        "$LLAISYS_GPU_CHECK_WHEELS"/*.whl
else
    PACKAGES="$ROOT/llaisys-core $ROOT/llaisys-backend-cpu $ROOT/llaisys-models $ROOT/llaisys-backend-cuda[nccl]"
    # online: build isolation fetches the CUDA wheels only if no toolkit is installed; offline: the installed
    # toolkit (CUDA_HOME / nvcc) and what the venv already has
    stage "build + install" 300 bash -c "'$PY' -m pip install -q ${PIP_ARGS:-} $PACKAGES -r '$ROOT/tests/requirements.txt' ||
        '$PY' -m pip install -q --no-build-isolation --no-deps ${PIP_ARGS:-} $PACKAGES"
fi
stage "cuda visible" 60 "$PY" -c "
import llaisys, sys
print(llaisys.available_devices())
import llaisys_backend_cuda.plugin as p
lib = p.load()
print(lib.lib.api_version, [r for r in llaisys.backend_report() if r.name == 'cuda'])
sys.exit(0 if any(d.type == 'cuda' for d in llaisys.available_devices()) else 1)"

# ---- 2, 3. tests on cuda -------------------------------------------------------------------------------
cd "$ROOT"
# the benchmark's model is written on the CPU while the tests run (it needs no GPU)
MODEL="$WORK/qwen2-1.5b-random"
MODEL_T0=$SECONDS
[ -f "$MODEL/config.json" ] || timeout 150 "$PY" benchmarks/make_model.py --out "$MODEL" >"$LOG/make_model.log" 2>&1 &
MAKE_MODEL=$!
PYTEST=("$PY" -m pytest -q -rfE --durations=10 -p no:cacheprovider --backend=cuda)
stage "op tests (cuda)" 200 "${PYTEST[@]}" tests/ops tests/core tests/backends/test_abi.py tests/backends/test_graphs.py \
    tests/backends/cuda/test_package.py
stage "model parity (cuda)" 180 "${PYTEST[@]}" tests/models

# ---- 4. end to end against HF on the same GPU ----------------------------------------------------------
if wait "$MAKE_MODEL"; then row "make 1.5B model (beside)" ok $((SECONDS - MODEL_T0)) "$MODEL"
else row "make 1.5B model (beside)" FAIL $((SECONDS - MODEL_T0)) "see $LOG/make_model.log"; fi
stage "e2e benchmark" 240 "$PY" benchmarks/e2e.py --model "$MODEL" --device cuda --decode-tokens 64
E2E="$LOG/e2e_benchmark.log"
stage "linear vs torch" 120 "$PY" benchmarks/linear_gpu.py
LINEAR="$LOG/linear_vs_torch.log"

# ---- 6. tensor parallelism over NCCL -------------------------------------------------------------------
NGPU="$(nvidia-smi -L | wc -l)"
if [ "$NGPU" -ge 2 ]; then TP_ARGS=(--device cuda); else TP_ARGS=(--device cuda --tensor-parallel 1 --through-communicator); fi
stage "tensor parallel ($NGPU GPU)" 240 "$PY" benchmarks/tp.py --model "$MODEL" --rounds 2 --decode-tokens 64 "${TP_ARGS[@]}"
TP="$LOG/tensor_parallel__${NGPU}_GPU_.log"

# ---- summary (last) ------------------------------------------------------------------------------------
echo
echo "llaisys GPU check — $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "GPU: $GPU, archs $LLAISYS_CUDA_ARCHS, total $((($(date +%s) - START)))s"
echo "llaisys column: decode steps replayed from CUDA graphs; eager column: LLAISYS_GRAPHS=0"
printf '%-28s %-6s %7s  %s\n' stage status time detail
for r in "${ROWS[@]}"; do echo "$r"; done
if [ -f "$E2E" ] && grep -q "^model " "$E2E"; then
    echo
    sed -n '/^model /,$p' "$E2E"
fi
if [ -f "$TP" ] && grep -q "^configuration" "$TP"; then
    echo
    sed -n '/^configuration/,$p' "$TP"
fi
if [ -f "$LINEAR" ] && grep -q "llaisys us" "$LINEAR"; then
    echo
    echo "linear, bf16 (ratio = torch / llaisys):"
    sed -n '/llaisys us/,$p' "$LINEAR"
fi

#!/usr/bin/env bash
# The GPU check, run from the repository root where the `wgpu` binaries are packed in
# target/gpu-check or target/gpu-check.tar.xz (`just gpu-check` packs them and, with --local, runs
# this at smoke scale here):
#
#   experiments/gpu_check/run.sh SCALE OUT      SCALE: paper-path (the check a GPU machine runs) or smoke
#
# 1. table11 on --device wgpu: FLASH, FLASH-Quad and Transformer++ at every context of the cpu profile;
# 2. one fig6 smoke sweep on --device wgpu;
# 3. gqa_fig6 on --device wgpu at batch 1 and 32 (smoke: 1 and 2);
# 4. the PyTorch anchors on CUDA, where PyTorch with CUDA is installed: experiments/anchors/torch_anchor.py
#    (flash-pytorch and x-transformers, from the packed wheels) and t5_decode_hf.py (transformers' T5
#    at gqa_fig6's shapes, batch as in 3).
# Every output goes under OUT; OUT/summary.md names the devices and what ran.
set -uo pipefail
scale=${1:?usage: run.sh paper-path|smoke OUT}
out=${2:?usage: run.sh paper-path|smoke OUT}
pack=${CARGO_TARGET_DIR:-target}/gpu-check
case $scale in
    paper-path) profile=cpu; batches="1 32" ;;
    smoke) profile=smoke; batches="1 2" ;;
    *) echo "error: unknown scale \`$scale\`: paper-path or smoke" >&2; exit 2 ;;
esac
if [ ! -x $pack/bin/table11 ] && [ -f $pack.tar.xz ]; then
    tar -C "$(dirname $pack)" -xJf $pack.tar.xz || { echo "error: cannot unpack $pack.tar.xz" >&2; exit 2; }
fi
[ -x $pack/bin/table11 ] || { echo "error: no $pack/bin/table11 (nor $pack.tar.xz); run \`just gpu-check\` first" >&2; exit 2; }
mkdir -p "$out"
summary=$out/summary.md
failed=0

# The Vulkan loader packed with the binaries, where the machine has none.
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
    export LD_LIBRARY_PATH=$PWD/$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

step() {  # step NAME COMMAND...: runs it with its log in OUT/NAME.log, records the outcome
    local name=$1; shift
    echo "== $name: $*"
    local start=$SECONDS
    if "$@" > "$out/$name.log" 2>&1; then
        echo "| $name | ok | $((SECONDS - start)) s | \`$*\` |" >> "$summary"
    else
        echo "| $name | **failed** (exit $?, \`$name.log\`) | $((SECONDS - start)) s | \`$*\` |" >> "$summary"
        tail -n 5 "$out/$name.log"
        failed=1
    fi
}

{
    echo "# GPU check ($scale), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "- commit: $(cat $pack/commit 2>/dev/null || echo unknown)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
    echo
    echo "| step | outcome | wall | command |"
    echo "|---|---|---|---|"
} > "$summary"

models='models=["flash", "flash_quad", "transformer_plusplus"]'
step table11 $pack/bin/table11 --profile $profile --device wgpu --set "$models" --out "$out/table11"
step fig6 $pack/bin/fig6 --profile smoke --device wgpu --out "$out/fig6" --store "$out/store"
for b in $batches; do
    step gqa_fig6_batch$b $pack/bin/gqa_fig6 --profile $profile --device wgpu --set "batch=$b" --out "$out/gqa_fig6_batch$b"
done

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    if ls $pack/wheels/*.whl >/dev/null 2>&1; then
        python3 -m pip install --quiet --no-index --no-deps --target "$out/pylib" $pack/wheels/*.whl \
            > "$out/pip.log" 2>&1 || echo "pip install of the packed wheels failed (pip.log)"
    fi
    contexts=512,1024,2048,4096,8192; [ $scale = smoke ] && contexts=512
    step torch_anchor_cuda env PYTHONPATH="$out/pylib" python3 experiments/anchors/torch_anchor.py \
        --device cuda --contexts $contexts --steps 5
    # gqa_fig6's shapes at its profile: T5-XXL per layer at cpu (paper-path), the smoke model's here.
    t5_shape=""; [ $scale = smoke ] && t5_shape="--input 16 --output 8 --d 32 --heads 8 --dkv 4 --dff 64 --vocab 256"
    for b in $batches; do
        step t5_anchor_cuda_batch$b python3 experiments/anchors/t5_decode_hf.py --device cuda --batch $b $t5_shape
    done
else
    echo "| torch_anchor_cuda, t5_anchor_cuda | skipped: no PyTorch with CUDA here | | |" >> "$summary"
fi

cat "$summary"
exit $failed

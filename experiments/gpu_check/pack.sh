#!/usr/bin/env bash
# `just gpu-check [--local]`: builds the `wgpu` binaries the GPU check runs, packs what a GPU machine
# without Rust or network needs into target/gpu-check (the binaries stripped, the Vulkan loader, the
# PyTorch anchor's wheels: under 64 MiB, what the borrowed machine takes with a command), and says
# how to run it there (`target/gpu-check.tar.xz`, the one file to carry; run.sh unpacks it). With --local it runs the same check here at smoke scale, on Mesa's software
# Vulkan device (lavapipe), so the script is tested on every change.
set -euo pipefail
cd "$(dirname "$0")/../.."
local_run=0
case "${1:-}" in
    --local) local_run=1 ;;
    "") ;;
    *) echo "error: unknown argument \`$1\`; \`just gpu-check\` packs for a GPU machine, \`just gpu-check --local\` also runs the check here" >&2; exit 2 ;;
esac
profile=${REPRO_CARGO_PROFILE:-release}
dir=$profile; [ "$profile" = dev ] && dir=debug
bins="table11 fig6 gqa_fig6"
pack=${CARGO_TARGET_DIR:-target}/gpu-check
# The PyTorch anchor's packages, without PyTorch itself (the GPU machine has it), pinned.
wheels="flash-pytorch==0.1.9 x-transformers==2.31.10 einops==0.8.2 rotary-embedding-torch==0.9.1
einx==0.4.3 loguru==0.7.3 torch-einops-utils==0.2.0 frozendict==2.5.1 packaging==26.4"
limit=$((64 << 20))

echo "== building $bins with --features wgpu (profile $profile)"
# `--workspace` resolves the features as `just test` does, so the dev build reuses CI's test build.
cargo build --profile "$profile" --quiet --workspace --features experiments/wgpu $(printf -- '--bin %s ' $bins)

rm -rf "$pack/bin" "$pack/lib"
mkdir -p "$pack/bin" "$pack/lib" "$pack/wheels"
for b in $bins; do
    cp "${CARGO_TARGET_DIR:-target}/$dir/$b" "$pack/bin/$b"
    strip "$pack/bin/$b"
done
loader=$(ldconfig -p | awk '/libvulkan\.so\.1 / && !p {p = $NF} END {print p}')
[ -n "$loader" ] || { echo "error: no Vulkan loader here (libvulkan.so.1); install it: apt-get install libvulkan1" >&2; exit 1; }
cp -L "$loader" "$pack/lib/libvulkan.so.1"
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!results' || echo -dirty)" > "$pack/commit"
if [ $local_run = 0 ]; then
    # shellcheck disable=SC2086
    pip download --quiet --no-deps -d "$pack/wheels" $wheels \
        || echo "warning: the anchor's wheels could not be downloaded; the check will skip the PyTorch anchor" >&2
fi
# One file to carry: the pack as an xz tarball (the three binaries share most of their code).
tarball=$pack.tar.xz
tar -C "$(dirname "$pack")" -cf - gpu-check/bin gpu-check/lib gpu-check/wheels gpu-check/commit \
    | xz -T0 -6 > "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
size=$(stat -c %s "$tarball")
echo "packed $tarball: $((size >> 20)) MiB ($(du -sh "$pack/bin" | cut -f1) of binaries unpacked)"

if [ $local_run = 1 ]; then
    if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
        echo "error: no lavapipe here; install it: apt-get install mesa-vulkan-drivers" >&2
        exit 1
    fi
    # As on the GPU machine: from the tarball alone.
    rm -rf "$pack/bin" "$pack/out"
    experiments/gpu_check/run.sh smoke "$pack/out"
    exit $?
fi
if [ "$size" -gt $limit ]; then
    echo "error: $tarball is $((size >> 20)) MiB, over the GPU machine's 64 MiB" >&2
    exit 1
fi
echo "On the GPU machine (carry $tarball): experiments/gpu_check/run.sh paper-path \$OUT/gpu"
echo "then commit \$OUT/gpu as results/gpu/ (summary.md names the device)."

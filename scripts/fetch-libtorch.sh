#!/usr/bin/env bash
# Installs libtorch 2.11.0 (CPU) for the policy (tch 0.24.0) into .deps/libtorch, from PyPI wheels
# verified by sha256. The torch wheel is a full libtorch; we keep only the CPU libraries:
#   .deps/libtorch/lib/      libtorch_cpu.so libc10.so libgomp.so.1, the CUDA runtime stubs that
#                            libtorch_cpu.so links even on CPU (libcudart, libcupti), and an empty
#                            libtorch.so that links the CPU libraries (torch-sys always passes -ltorch;
#                            the wheel's own one needs libtorch_cuda.so and gigabytes of CUDA).
#   .deps/libtorch/include/  the C++ headers torch-sys compiles against.
#   .deps/libtorch/build-version
# On a GPU machine, point LIBTORCH at a CUDA build of the same version instead (see docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[libtorch] %s\n' "$*" >&2; }

DEST=.deps/libtorch
VERSION=2.11.0
STAMP="$DEST/.toolsmith-complete-$VERSION"
if [ -f "$STAMP" ]; then
    exit 0
fi
if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    say "only x86_64 Linux is scripted: set LIBTORCH to a libtorch $VERSION install"
    exit 1
fi

# shellcheck source=lib/wheels.sh
. scripts/lib/wheels.sh

TORCH_WHEEL=torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl
CUDART_WHEEL=nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
CUPTI_WHEEL=nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl
# pip matches --platform exactly: offer every tag these wheels use (and the CPython 3.11 ABI).
PLATFORMS=(--python-version 3.11 --implementation cp --abi cp311 --abi none
    --platform manylinux_2_28_x86_64 --platform manylinux_2_25_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

fetch torch==$VERSION "$TORCH_WHEEL" 7aa2f9bbc6d4595ba72138026b2074be1233186150e9292865e04b7a63b8c67a "${PLATFORMS[@]}"
fetch nvidia-cuda-runtime==13.0.96 "$CUDART_WHEEL" 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 "${PLATFORMS[@]}"
fetch nvidia-cuda-cupti==13.0.85 "$CUPTI_WHEEL" 4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8 "${PLATFORMS[@]}"

say "unpacking libtorch $VERSION into $DEST"
tmp="$(mktemp -d .deps/.libtorch.XXXXXX)"
trap 'rm -rf -- "$tmp"' EXIT
python3 - "$DOWNLOADS" "$TORCH_WHEEL" "$CUDART_WHEEL" "$CUPTI_WHEEL" "$tmp" <<'PY'
import os, shutil, sys, zipfile
downloads, torch_wheel, cudart_wheel, cupti_wheel, dest = sys.argv[1:]
os.makedirs(f"{dest}/lib")

def copy(zf, member, target):
    with zf.open(member) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)

with zipfile.ZipFile(f"{downloads}/{torch_wheel}") as z:
    for lib in ("libtorch_cpu.so", "libc10.so", "libgomp.so.1"):
        copy(z, f"torch/lib/{lib}", f"{dest}/lib/{lib}")
    for info in z.infolist():
        if info.filename.startswith("torch/include/") and not info.is_dir():
            target = os.path.join(dest, info.filename[len("torch/"):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            copy(z, info.filename, target)
    z_license = [n for n in z.namelist() if n.endswith(".dist-info/LICENSE") or n.endswith("licenses/LICENSE")]
    if z_license:
        copy(z, z_license[0], f"{dest}/LICENSE")
with zipfile.ZipFile(f"{downloads}/{cudart_wheel}") as z:
    copy(z, "nvidia/cu13/lib/libcudart.so.13", f"{dest}/lib/libcudart.so.13")
with zipfile.ZipFile(f"{downloads}/{cupti_wheel}") as z:
    copy(z, "nvidia/cu13/lib/libcupti.so.13", f"{dest}/lib/libcupti.so.13")
PY
if command -v strip >/dev/null 2>&1; then
    strip --strip-unneeded "$tmp/lib/libtorch_cpu.so" "$tmp/lib/libc10.so"
fi
cc -shared -fPIC -x c /dev/null -o "$tmp/lib/libtorch.so" -Wl,-soname,libtorch.so \
    -L"$tmp/lib" -Wl,--no-as-needed -ltorch_cpu -lc10 -Wl,-rpath,'$ORIGIN'
echo "$VERSION+cu130" >"$tmp/build-version"
rm -rf -- "$DEST"
mv "$tmp" "$DEST"
trap - EXIT
: >"$STAMP"
say "ok ($(du -sh "$DEST" | cut -f1))"

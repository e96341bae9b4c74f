#!/usr/bin/env bash
# Builds, on this machine, what scripts/device/nvidia-check.sh carries to a GPU machine:
# .devcheck/ with cuda_probe, a minimal container root (busybox, glibc, ldconfig,
# cuda_probe), runc and its libseccomp, and nvidia-ctk (NVIDIA Container Toolkit, from the
# Go module proxy) whose `cdi generate` is compared with container-runtime's spec; .whl/
# with the Python packages the GPU machine's python3 lacks. Needs gcc, go, busybox-static,
# runc (lab/up installs the last two).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.devcheck
rm -rf "$out" && mkdir -p "$out/lib" "$out/rootfs"
gcc -O2 -Wall -o "$out/cuda_probe" scripts/device/cuda_probe.c -ldl
r="$out/rootfs"
mkdir -p "$r"/{bin,sbin,lib64,lib/x86_64-linux-gnu,etc,tmp,proc,sys,dev,run}
cp /bin/busybox "$r/bin/busybox"
for t in sh ls grep cat echo head; do ln -s busybox "$r/bin/$t"; done
cp /sbin/ldconfig "$r/sbin/ldconfig"
for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$r/lib/x86_64-linux-gnu/$l"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
echo "/lib/x86_64-linux-gnu" > "$r/etc/ld.so.conf"
echo "root:x:0:0:root:/root:/bin/sh" > "$r/etc/passwd"
cp "$out/cuda_probe" "$r/cuda_probe"
tar -C "$r" -cf "$out/rootfs.tar" . && rm -rf "$r"
cp "$(command -v runc)" "$out/runc.bin"
cp -L /usr/lib/x86_64-linux-gnu/libseccomp.so.2 "$out/lib/"
printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")\nLD_LIBRARY_PATH="$d/lib" exec "$d/runc.bin" "$@"\n' > "$out/runc"
chmod +x "$out/runc"
GOFLAGS=-mod=mod GOBIN="$PWD/$out" go install github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk@v1.20.2
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "protobuf==$(sed -n 's/.*Protobuf Python Version: \([0-9.]*\).*/\1/p' src/gpuk8s/services/node/api/deviceplugin_v1beta1_pb2.py)" tomlkit==0.15.2
du -sh "$out" .whl

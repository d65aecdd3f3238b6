#!/usr/bin/env bash
# The Debian 12 packages rekindle needs, by group, and their installation. It first asks dpkg
# what is installed: when nothing of the groups asked for is missing it exits 0 at once, as
# any user, without apt-get or root. Only a missing package needs root: as root it installs
# it with apt-get; as another user it prints the exact command and exits 1.
#   scripts/install-deps.sh [GROUP...]   default: build run test
#     build  compilers, CMake and the -dev packages (make build), with gRPC core and
#            protobuf-c and its compiler (rk device-plugin); clang, which also compiles the GPU
#            kernels to PTX (src/gpu/kernels.cu; without it rk has no GPU kernels); dpkg-dev and
#            file (make package: dpkg-shlibdeps and dpkg-buildflags, and CPack's look at the ELF files)
#     run    what rk, librekindle and the demo need at run time: the shared libraries,
#            mpirun, python3 with python3-xxhash (the Python package's checkpoints) and the
#            Fashion-MNIST data (make demo)
#     test   libcmocka-dev (the unit tests), libclang-rt-14-dev (the fuzzers' runtime), clang-format (make format-check), prometheus and promtool
#            (the exporter's integration tests), curl (the scraper of it_exporter_slow.sh),
#            python3-torch and python3-numpy (the PyTorch jobs' tests and torchrun, their peer),
#            python3-pip, -setuptools, -wheel, -venv (the `pip install ./python` test),
#            iproute2 and iputils-ping (the test cluster of network namespaces, tests/cluster),
#            Slurm's controller, daemon and client (the Slurm rig, tests/slurm), python3-grpcio
#            and python3-grpc-tools (the fake kubelet, tests/k8s) and kubectl (the
#            kubernetes-client package, checking deploy/k8s; left out when another package
#            already installed a kubectl, which it would collide with), chromium (rk report's
#            page rendered headless to a PNG, tests/it_report.sh), lintian and systemd
#            (tests/it_package.sh: lintian on the .debs, systemd-analyze verify on the units),
#            tmux (a real terminal at 60, 80 and 200 columns for tests/it_term.sh)
#     bench  the benchmark peers: libtorch-dev (large), wrk, prometheus-node-exporter
#   --bench  the same as: build run test bench
set -euo pipefail

declare -A group
group[build]="build-essential cmake pkg-config openmpi-bin libopenmpi-dev
  libdnnl-dev libjansson-dev libxxhash-dev zlib1g-dev libmicrohttpd-dev
  libopenblas-dev libssl-dev libgrpc-dev libprotobuf-c-dev protobuf-c-compiler dpkg-dev file
  clang"
group[run]="libdnnl2 libgomp1 libjansson4 libxxhash0 zlib1g libopenmpi3 openmpi-bin
  libmicrohttpd12 libopenblas0 libssl3 libgrpc29 libprotobuf-c1 python3 python3-xxhash
  dataset-fashion-mnist"
group[test]="libcmocka-dev libclang-rt-14-dev clang-format git python3 prometheus curl python3-torch
  python3-numpy python3-pip python3-setuptools python3-wheel python3-venv iproute2 iputils-ping
  slurmctld slurmd slurm-client python3-grpcio python3-grpc-tools kubernetes-client chromium
  lintian systemd tmux"
group[bench]="libtorch-dev wrk prometheus-node-exporter"

asked=("$@")
[[ ${#asked[@]} -gt 0 ]] || asked=(build run test)
[[ "${asked[*]}" != "--bench" ]] || asked=(build run test bench)
pkgs=()
for g in "${asked[@]}"; do
  if [[ -z "${group[$g]+set}" ]]; then
    echo "usage: $0 [build|run|test|bench ...] | --bench" >&2
    exit 2
  fi
  # shellcheck disable=SC2206
  pkgs+=(${group[$g]})
done

missing=()
for p in $(printf '%s\n' "${pkgs[@]}" | sort -u); do
  # kubectl from another package (a cloud SDK's) would collide with kubernetes-client's
  if [[ "$p" == kubernetes-client ]] && command -v kubectl >/dev/null 2>&1 &&
    ! dpkg-query -S "$(command -v kubectl)" 2>/dev/null | grep -q '^kubernetes-client:'; then
    continue
  fi
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
if [[ $(id -u) -ne 0 ]]; then
  echo "rekindle: missing Debian packages (${asked[*]}): ${missing[*]}" >&2
  echo "installing them needs root: sudo sh -c 'apt-get update && DEBIAN_FRONTEND=noninteractive ${cmd[*]}'" >&2
  exit 1
fi
echo "rekindle: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
"${cmd[@]}"

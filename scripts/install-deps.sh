#!/usr/bin/env bash
# Install every Debian package rekindle needs to build, test and run its demo. Idempotent:
# packages already installed are left alone. As root it uses apt-get; otherwise it prints the
# exact command to run and exits 1.
#   scripts/install-deps.sh          build + test + demo dependencies
#   scripts/install-deps.sh --bench  also the benchmark tools (libtorch-dev, large; wrk and
#                                    prometheus-node-exporter for bench/exporter_load)
# prometheus gives the real server and promtool for the exporter's integration tests; curl
# is the scraper of tests/it_exporter_slow.sh.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config clang libclang-rt-14-dev python3
  libdnnl-dev libcmocka-dev libjansson-dev libxxhash-dev zlib1g-dev
  libopenmpi-dev openmpi-bin libmicrohttpd-dev libopenblas-dev
  prometheus curl
  dataset-fashion-mnist
)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(libtorch-dev wrk prometheus-node-exporter)
elif [[ -n "${1:-}" ]]; then
  echo "usage: $0 [--bench]" >&2
  exit 2
fi

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

cmd=(apt-get install -y --no-install-recommends "${missing[@]}")
if [[ $(id -u) -ne 0 ]]; then
  echo "rekindle: missing Debian packages: ${missing[*]}" >&2
  echo "run as root: apt-get update && DEBIAN_FRONTEND=noninteractive ${cmd[*]}" >&2
  exit 1
fi
echo "rekindle: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
"${cmd[@]}"

#!/usr/bin/env bash
# Installs what memsnap needs on Debian (as root), or prints the exact apt-get line and fails.
# usage: scripts/deps.sh [build|test|fuzz|bench|wheel]   (test adds the browser used by the SVG tests and
# python3 for scripts/check-deps.py, sqlite3 and golang-go whose tools read the exports back, and
# what the Python package's tests use: venv, pytest, nbclient, ipykernel; wheel: python3 and patchelf)
set -euo pipefail
what=${1:-build}
pkgs=(cmake make gcc pkg-config libmsgpack-dev zlib1g-dev libxml2-dev libdw-dev libsqlite3-dev)
case "$what" in
  test) pkgs+=(libcriterion-dev chromium clang python3 sqlite3 golang-go
        patchelf python3-venv python3-pytest python3-nbclient python3-ipykernel) ;;
  wheel) pkgs+=(python3 patchelf) ;;
  fuzz) pkgs+=(clang libclang-rt-14-dev) ;;
  bench) pkgs+=(python3 patchelf) ;;  # patchelf: bench_python makes the wheel
esac
missing=()
for p in "${pkgs[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$st" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
line="apt-get install -y ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "memsnap: error: missing Debian packages; install them with:" >&2
  echo "  sudo apt-get update && sudo $line" >&2
  exit 1
fi
echo "memsnap: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

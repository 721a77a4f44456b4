#!/usr/bin/env bash
# Installs, from Debian's archive, what libte needs to build, test and benchmark:
# compilers and meson, the libraries of libte and its plugins, and the servers
# and tools the tests start (etcd, redis, iperf3, fio), and the toolchains of
# the language bindings (CPython headers and pytest, Go, Rust), qemu and
# valgrind for the reliability suite, clang with its libFuzzer runtime
# (libclang-rt-14-dev, not pulled in without recommends) for the fuzzers,
# abigail-tools for the ABI check, scdoc and man-db for the manual pages,
# debhelper, dh-python, lintian and fakeroot for the Debian packages, and
# meson-python, venv, pip and patchelf for the Python wheel (tests/install).
# Debian 12 or newer; root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends \
  build-essential meson ninja-build pkg-config python3 ca-certificates openssl binutils \
  libglib2.0-dev libjson-glib-dev libnuma-dev libsoup-3.0-dev libhiredis-dev \
  libibverbs-dev rdma-core ibverbs-providers liburing-dev \
  etcd-server etcd-client redis-server iperf3 fio iproute2 nftables procps prometheus \
  python3-dev python3-pytest python3-numpy golang-go cargo rustc rust-clippy \
  qemu-system-x86 linux-image-amd64 busybox-static valgrind \
  clang libclang-rt-14-dev \
  abigail-tools scdoc man-db \
  git dpkg-dev debhelper dh-python lintian fakeroot \
  python3-mesonpy python3-venv python3-pip patchelf

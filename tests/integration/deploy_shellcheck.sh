#!/usr/bin/env bash
# Runs shellcheck over every shell script under deploy/, found now (a file
# named *.sh or *.bash, or one whose #! line names sh, bash, dash or ksh),
# at shellcheck's default severity (style and up); sourced files are
# followed (-x).
# Exit 77 (skipped) if shellcheck is missing (tools/setup installs it).
# Usage: deploy_shellcheck.sh SOURCE_DIR
set -euo pipefail
cd "$1"
command -v shellcheck >/dev/null ||
  { echo "deploy_shellcheck: skipped: no shellcheck (tools/setup installs it)" >&2; exit 77; }
[[ -d deploy ]] || { echo "deploy_shellcheck: no deploy/ directory" >&2; exit 1; }

scripts=()
while IFS= read -r -d '' f; do
  case $f in
    *.sh | *.bash) scripts+=("$f"); continue ;;
  esac
  IFS= read -r first <"$f" || true
  if [[ $first =~ ^#!.*(/|[[:space:]])(ba|da|k)?sh([[:space:]]|$) ]]; then
    scripts+=("$f")
  fi
done < <(find deploy -path '*/node_modules' -prune -o -type f -print0 | sort -z)
[[ ${#scripts[@]} -gt 0 ]] || { echo "deploy_shellcheck: no shell script under deploy/" >&2; exit 1; }

shellcheck -x "${scripts[@]}"
echo "deploy_shellcheck: ${#scripts[@]} scripts clean: ${scripts[*]}"

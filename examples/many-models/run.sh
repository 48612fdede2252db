#!/usr/bin/env bash
# Generate the example's input when missing, make a Python with pandas (target/pyenv), then
# run the job on this machine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
[ -f "$here/data/MLTable" ] || python3 "$here/generate.py" --out "$here/data"
[ -x target/pyenv/bin/python ] || infra/python-env
export BATCHFLEET_PYTHON="${BATCHFLEET_PYTHON:-$PWD/target/pyenv/bin/python}"
exec cargo run --release -p batchfleet-producer -- run "$here/job.yaml" "$@"

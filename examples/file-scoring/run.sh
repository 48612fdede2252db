#!/usr/bin/env bash
# Generate the example's input (2,000 files) when missing, then run the job on this machine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
[ -d "$here/data" ] || python3 "$here/generate.py" --out "$here/data"
exec cargo run --release -p batchfleet-producer -- run "$here/job.yaml" "$@"

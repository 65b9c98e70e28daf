#!/usr/bin/env bash
# Runs ctests/mpi_cover.c as a 2-rank Open MPI job and checks that, in every epoch, the ranks
# got equal batch counts and together every sample (with only DistributedSampler's padding
# repeated).
#
#   ctests/mpi_cover.sh PATH/TO/mpi_cover
set -euo pipefail
prog=$1
rows=37
epochs=2
out="$(mktemp -d "${TMPDIR:-/tmp}/stoker-mpi.XXXXXX")"
trap 'rm -rf "$out"' EXIT
# Root in containers; two slots may exceed the cores mpirun counts.
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$prog" "$out" "$rows" "$epochs"
python3 - "$out" "$rows" "$epochs" <<'PY'
import sys
from collections import Counter
out, rows, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per_rank = []
for r in range(2):
    lines = [l.split() for l in open(f"{out}/rank-{r}.txt")]
    per_rank.append(lines)
for e in range(epochs):
    batches = [[l[3:] for l in lines if l[1] == str(e)] for lines in per_rank]
    assert len(batches[0]) == len(batches[1]), f"epoch {e}: unequal batch counts"
    ids = Counter(int(i) for b in batches for batch in b for i in batch)
    assert set(ids) == set(range(rows)), f"epoch {e}: missing {set(range(rows)) - set(ids)}"
    assert sum(ids.values()) == -(-rows // 2) * 2, f"epoch {e}: {sum(ids.values())} samples"
    print(f"mpirun -np 2, epoch {e}: {len(batches[0])} batches per rank, exact coverage")
PY

"""Checks a ddp_train.py log: every epoch covers every sample exactly, padding aside.

    check_coverage.py LOG N BATCH EPOCHS

An epoch run by W ranks from start to end sees ceil(N / W) * W samples: every id, with the
padding DistributedSampler adds as its only repeats. An epoch interrupted after k steps at W
ranks and finished at W' ranks sees the first k*B*W entries of its global order (no repeats) and
then the remaining R = N - k*B*W dealt to W' ranks: ceil(R / W') * W' more, again every
remaining id with padding as the only repeats.
"""

import json
import sys
from collections import Counter


def main() -> None:
    log, n, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    steps: dict[int, list[dict]] = {}
    ends: dict[int, list[dict]] = {}
    for line in open(log):
        rec = json.loads(line)
        if "epoch_end" in rec:
            ends.setdefault(rec["epoch_end"], []).append(rec)
        else:
            steps.setdefault(rec["epoch"], []).append(rec)
    assert sorted(steps) == list(range(epochs)), f"epochs logged: {sorted(steps)}"
    for epoch in range(epochs):
        recs = steps[epoch]
        worlds = []  # (world, steps) runs in order
        for r in recs:
            if not worlds or worlds[-1][0] != r["world"]:
                worlds.append([r["world"], 0])
            worlds[-1][1] += 1
        ids = [i for r in recs for i in r["ids"]]
        count = Counter(ids)
        assert set(count) == set(range(n)), f"epoch {epoch}: missing {set(range(n)) - set(count)}"
        expected = 0
        remaining = n
        for w, k in worlds[:-1]:
            head = ids[expected:expected + k * batch * w]
            assert len(set(head)) == len(head), f"epoch {epoch}: repeats before the restart"
            expected += k * batch * w
            remaining -= k * batch * w
        w = worlds[-1][0]
        expected += -(-remaining // w) * w
        assert len(ids) == expected, f"epoch {epoch} {worlds}: {len(ids)} samples, expected {expected}"
        assert ends.get(epoch), f"epoch {epoch} never ended"
        print(f"epoch {epoch}: runs {[(w, k) for w, k in worlds]}, {len(ids)} samples, "
              f"{len(count)} distinct: exact")
    print("coverage exact")


if __name__ == "__main__":
    main()

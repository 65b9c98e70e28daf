"""Reads the shards served by ctests/remote/run.sh through stoker's Python face: every sample
once per epoch over http:// and https:// (nginx) and s3:// (an S3 server), in indexed and
streaming mode, with a shared cache_dir, from shard patterns and from a WebDataset `wids` index
(streaming from an index reads each shard while it downloads); a missing object raises
StokerIOError naming the URL and the status, without the credentials."""

import os
import sys
import tempfile

import stoker


def labels(loader: stoker.Loader) -> list[int]:
    out: list[int] = []
    for batch in loader:
        out.extend(int(v) for v in batch["label"])
    return sorted(out)


def main() -> int:
    samples = int(os.environ["STOKER_REMOTE_SAMPLES"])
    # The indexes first, streaming first: their shards are read while they download into the
    # cold cache; the later reads find them cached.
    patterns = [
        os.environ["STOKER_REMOTE_HTTP_INDEX"],
        os.environ["STOKER_REMOTE_S3_INDEX"],
        os.environ["STOKER_REMOTE_HTTP"],
        os.environ["STOKER_REMOTE_HTTPS"],
        os.environ["STOKER_REMOTE_S3"],
    ]
    with tempfile.TemporaryDirectory(prefix="stoker-remote-py-") as cache:
        for pattern in patterns:
            for shuffle_buffer in (16, 0):
                with stoker.Loader(
                    f"tar:{pattern}",
                    batch_size=4,
                    fields="cls:label",
                    shuffle_buffer=shuffle_buffer,
                    cache_dir=cache,
                    shard_prefetch=2,
                ) as loader:
                    for epoch in range(2):
                        loader.set_epoch(epoch)
                        got = labels(loader)
                        assert got == list(range(samples)), (pattern, shuffle_buffer, got)
            print(f"python: {pattern}: {samples} samples per epoch, both modes")
    missing = os.environ["STOKER_REMOTE_S3"].replace("shard-", "absent-")
    try:
        stoker.Loader(f"tar:{missing}", fields="cls:label")
    except stoker.StokerIOError as e:
        text = str(e)
        assert "absent-000.tar" in text and "HTTP 404" in text, text
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text, text
        print(f"python: missing object: {text}")
    else:
        raise AssertionError("a missing object must fail")
    return 0


if __name__ == "__main__":
    sys.exit(main())

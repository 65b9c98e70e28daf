"""Dense tasks from the files people have: a WebDataset shard of JPEG photos with PNG class masks
(Pillow writes both; the masks as VOC stores them, palette images whose *indices* are the labels)
read with ``fields(image=..., mask=...)``. The mask must come out label-exact, through the same
draw as its image, against torchvision v2 on that draw; a mask of another size than its image is
that sample's error, naming it and both sizes, and is replaced under ``on_error="skip"``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import stoker

Image = pytest.importorskip("PIL.Image")
wds = pytest.importorskip("webdataset")
torch = pytest.importorskip("torch")
tv_tensors = pytest.importorskip("torchvision.tv_tensors")
F = pytest.importorskip("torchvision.transforms.v2").functional

N, W, H = 6, 64, 48


def voc_palette() -> list[int]:
    """VOC's colour map: index i's colour interleaves i's bits; no colour equals its index."""
    out = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= (c & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out += [r, g, b]
    return out


def photo(i: int) -> np.ndarray:
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([x * 4, y * 5, np.full_like(x, 20 * i)], -1).astype(np.uint8)


def classes(i: int) -> np.ndarray:
    """Class indices 0..20 in blobs, 255 (VOC's "void") on the border."""
    y, x = np.mgrid[0:H, 0:W]
    m = ((x // 5 + y // 7 + i) % 21).astype(np.uint8)
    m[0, :] = m[-1, :] = m[:, 0] = m[:, -1] = 255
    return m


def jpeg(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=95)
    return b.getvalue()


def palette_png(m: np.ndarray) -> bytes:
    im = Image.fromarray(m, "P")
    im.putpalette(voc_palette())
    b = io.BytesIO()
    im.save(b, "PNG")
    return b.getvalue()


def coords_png(h: int = H, w: int = W) -> bytes:
    """A 16-bit grayscale mask whose label at (x, y) is ``y * W + x``."""
    b = io.BytesIO()
    labels = (np.arange(h)[:, None] * W + np.arange(w)[None, :]).astype(np.uint16)
    Image.fromarray(labels).save(b, "PNG")
    return b.getvalue()


def shard(tmp_path, masks) -> str:
    path = tmp_path / "seg-000000.tar"
    with wds.TarWriter(str(path)) as sink:
        for i, mask in enumerate(masks):
            sink.write({"__key__": f"{i:06d}", "jpg": jpeg(photo(i)), "png": mask})
    return f"tar:{path}"


def run(source: str, spec: str, **options):
    loader = stoker.Loader(source, batch_size=2, fields="jpg:image,png:mask", transform=spec,
                           **options)
    out = [(np.array(b["image"]), np.array(b["mask"])) for b in loader]
    return out, loader


def test_voc_palette_masks_are_their_indices_after_torchvisions_crop(tmp_path):
    source = shard(tmp_path, [palette_png(classes(i)) for i in range(N)])
    out, _ = run(source, "fields(image=image, mask=mask) | center_crop(32, 40)")
    masks = np.concatenate([m for _, m in out])
    assert masks.dtype == np.int64 and masks.shape == (N, 32, 40)
    for i in range(N):
        want = F.center_crop(tv_tensors.Mask(torch.from_numpy(classes(i))[None]), [32, 40])
        np.testing.assert_array_equal(masks[i], want[0].numpy().astype(np.int64))
    assert set(np.unique(masks)) <= set(range(21)) | {255}


def test_a_jpeg_and_its_mask_take_one_draw(tmp_path):
    source = shard(tmp_path, [coords_png() for _ in range(N)])
    out, _ = run(source, "fields(image=image, mask=mask) | random_crop(24) | hflip",
                 shuffle=True, seed=7)
    flips = set()
    for images, masks in out:
        for image, mask in zip(images, masks):
            flip = mask[0, 0] % W > mask[0, -1] % W
            unflipped = mask[:, ::-1] if flip else mask
            top, left = divmod(int(unflipped[0, 0]), W)
            coords = tv_tensors.Mask(
                torch.from_numpy((np.arange(H)[:, None] * W + np.arange(W)).astype(np.int64))[None])
            want = F.crop(coords, top, left, 24, 24)
            if flip:
                want = F.horizontal_flip(want)
            np.testing.assert_array_equal(mask, want[0].numpy())
            flips.add(bool(flip))
            # The photo's red and green say where each pixel came from (within JPEG's loss).
            src = photo(0)[top:top + 24, left:left + 24]
            if flip:
                src = src[:, ::-1]
            diff = np.abs(image[:2].astype(int) - src.transpose(2, 0, 1)[:2].astype(int))
            assert diff.mean() < 3, diff.mean()
    assert flips == {True, False}


def test_a_mask_of_another_size_names_the_sample_and_both_sizes(tmp_path):
    masks = [coords_png() for _ in range(N)]
    masks[3] = coords_png(h=H - 8)
    source = shard(tmp_path, masks)
    spec = "fields(image=image, mask=mask) | center_crop(24)"
    with pytest.raises(stoker.StokerError, match=r"000003[\s\S]*64x40[\s\S]*64x48"):
        run(source, spec)
    out, loader = run(source, spec, on_error="skip")
    assert sum(len(m) for _, m in out) == N
    assert loader.stats().samples_skipped == 1


def test_segmentation_folder_reads_voc_style_twin_trees(tmp_path):
    """``images/<split>/NAME.jpg`` beside ``masks/<split>/NAME.png`` (VOC's ``JPEGImages`` and
    ``SegmentationClass`` under the names the rule gives them)."""
    names = ["train/2007_000032", "train/2007_000039", "val/2007_000033"]
    for i, name in enumerate(names):
        (tmp_path / "images" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "masks" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / f"{name}.jpg").write_bytes(jpeg(photo(i)))
        (tmp_path / "masks" / f"{name}.png").write_bytes(palette_png(classes(i)))
    loader = stoker.Loader(f"segmentation_folder:{tmp_path}", batch_size=3,
                           transform="fields(image=image, mask=mask) | center_crop(48, 64)")
    (batch,) = list(loader)
    assert np.array(batch["image"]).shape == (3, 3, 48, 64)
    masks = np.array(batch["mask"])
    for i in range(3):
        np.testing.assert_array_equal(masks[i], classes(i).astype(np.int64))
    (tmp_path / "masks" / "val" / "2007_000033.png").unlink()
    with pytest.raises(stoker.StokerError, match=r"images/val/2007_000033\.jpg.*masks/val/2007_000033\.png"):
        stoker.Loader(f"segmentation_folder:{tmp_path}", batch_size=3,
                      transform="fields(image=image, mask=mask) | center_crop(48, 64)")


def detection_shard(tmp_path, annotations) -> str:
    import json

    path = tmp_path / "det-000000.tar"
    with wds.TarWriter(str(path)) as sink:
        for i, ann in enumerate(annotations):
            sink.write({"__key__": f"{i:06d}", "jpg": jpeg(photo(i)),
                        "json": json.dumps(ann).encode()})
    return f"tar:{path}"


DETECTION = [
    {"boxes": [[3.0, 4.0, 20.0, 10.0], [40.25, 30.5, 23.75, 17.5]], "labels": [5, 17]},
    {"boxes": [[0.0, 0.0, 64.0, 48.0]], "labels": [1]},
    {"boxes": [], "labels": []},
    {"boxes": [[10.0, 10.0, 0.5, 8.0], [8.0, 8.0, 8.0, 8.0]], "labels": [2, 3]},
]


def test_json_boxes_and_labels_match_torchvisions_bounding_boxes(tmp_path):
    source = detection_shard(tmp_path, DETECTION)
    spec = "fields(image=image, boxes=boxes:xywh, labels=labels) | hflip(p=1) | center_crop(32, 40)"
    loader = stoker.Loader(source, batch_size=4, transform=spec, ragged="offsets",
                           fields="jpg:image,json#boxes:boxes,json#labels:labels")
    (batch,) = list(loader)
    boxes, labels = np.array(batch["boxes"]), np.array(batch["labels"])
    offsets = np.array(batch["boxes_offsets"])
    assert boxes.dtype == np.float32 and labels.dtype == np.int64
    for i, ann in enumerate(DETECTION):
        bb = tv_tensors.BoundingBoxes(torch.tensor(ann["boxes"], dtype=torch.float32).reshape(-1, 4),
                                      format="XYWH", canvas_size=(H, W))
        bb = F.center_crop(F.horizontal_flip(bb), [32, 40])
        bb = F.clamp_bounding_boxes(bb)
        keep = (bb[:, 2] >= 1) & (bb[:, 3] >= 1)
        got = slice(offsets[i], offsets[i + 1])
        np.testing.assert_allclose(boxes[got], bb[keep].numpy(), atol=1e-4)
        np.testing.assert_array_equal(labels[got], np.array(ann["labels"], np.int64)[keep.numpy()])


@pytest.mark.parametrize("bad, words", [
    ({"boxes": [[1.0, 1.0, -4.0, 4.0]], "labels": [3]}, "negative width or height"),
    ({"boxes": [[60.0, 1.0, 20.0, 4.0]], "labels": [3]}, "outside the 64x48 image"),
    ({"boxes": [[1.0, 1.0, 4.0, 4.0]], "labels": [3, 4]}, "2 labels for 1 boxes"),
])
def test_a_bad_annotation_is_its_samples_error(tmp_path, bad, words):
    source = detection_shard(tmp_path, [DETECTION[0], bad, DETECTION[1]])
    options = dict(batch_size=3, ragged="offsets",
                   fields="jpg:image,json#boxes:boxes,json#labels:labels",
                   transform="fields(image=image, boxes=boxes:xywh, labels=labels) | center_crop(32)")
    with pytest.raises(stoker.StokerError, match=f"000001[\\s\\S]*{words}"):
        list(stoker.Loader(source, **options))
    loader = stoker.Loader(source, on_error="skip", **options)
    assert sum(len(b["image"]) for b in loader) == 3
    assert loader.stats().samples_skipped == 1


def rle_string(mask: np.ndarray) -> str:
    """pycocotools' ``mask.encode(...)["counts"]``: column-major runs from 0, each count in 5-bit
    groups as characters from 48, counts after the third as differences from two before."""
    flat = mask.T.reshape(-1).astype(np.uint8)
    counts, value, run = [], 0, 0
    for v in flat:
        if v != value:
            counts.append(run)
            value, run = v, 0
        run += 1
    counts.append(run)
    out = ""
    for i, x in enumerate(counts):
        if i > 2:
            x -= counts[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if c & 0x10 else (x != 0)
            if more:
                c |= 0x20
            out += chr(c + 48)
    return out


def test_coco_instances_json_gives_boxes_labels_and_the_semantic_mask(tmp_path):
    import json

    (tmp_path / "val2017").mkdir()
    (tmp_path / "annotations").mkdir()
    ids = [42, 7, 139]
    for n, i in enumerate(ids):
        Image.fromarray(photo(n)).save(tmp_path / "val2017" / f"{i:012d}.jpg", quality=95)
    crowd = np.zeros((H, W), bool)
    crowd[30:40, 5:9] = True
    crowd[31, 9] = True
    anns = [
        # Rectangles with integer corners: every rasteriser fills the same pixels.
        dict(id=1, image_id=42, category_id=18, iscrowd=0, area=80.0, bbox=[4.0, 6.0, 10.0, 8.0],
             segmentation=[[4, 6, 14, 6, 14, 14, 4, 14]]),
        dict(id=2, image_id=42, category_id=1, iscrowd=1, area=float(crowd.sum()),
             bbox=[5.0, 30.0, 5.0, 10.0],
             segmentation={"counts": rle_string(crowd), "size": [H, W]}),
        dict(id=3, image_id=139, category_id=3, iscrowd=0, area=4.0, bbox=[60.0, 40.0, 2.5, 1.5],
             segmentation=[[60, 40, 62, 40, 62, 42, 60, 42]]),
    ]
    images = [dict(id=i, file_name=f"{i:012d}.jpg", width=W, height=H, license=1) for i in ids]
    (tmp_path / "annotations" / "instances_val2017.json").write_text(json.dumps(
        {"info": {}, "licenses": [], "images": images, "annotations": anns,
         "categories": [{"id": c, "name": str(c), "supercategory": "x"} for c in (1, 3, 18)]}))
    ann = tmp_path / "annotations" / "instances_val2017.json"
    loader = stoker.Loader(
        f"coco_masks:{ann}", batch_size=3, ragged="offsets",
        transform="fields(image=image, mask=mask, boxes=boxes:xywh, labels=labels) "
                  "| center_crop(48, 64)")
    (batch,) = list(loader)
    offsets = np.array(batch["boxes_offsets"])
    np.testing.assert_array_equal(offsets, [0, 0, 2, 3])  # ids in order: 7, 42, 139
    np.testing.assert_array_equal(np.array(batch["labels"]), [18, 1, 3])
    np.testing.assert_array_equal(np.array(batch["boxes"]),
                                  np.array([a["bbox"] for a in anns], np.float32))
    masks = np.array(batch["mask"])
    want = np.zeros((3, H, W), np.int64)
    want[1, 6:14, 4:14] = 18
    want[1][crowd] = 1
    want[2, 40:42, 60:62] = 3
    np.testing.assert_array_equal(masks, want)
    # The images come through in the same order: blue is 20 * their place in `ids`.
    blue = np.array(batch["image"])[:, 2, 24, 32]
    assert np.all(np.abs(blue.astype(int) - [20, 0, 40]) <= 3), blue
